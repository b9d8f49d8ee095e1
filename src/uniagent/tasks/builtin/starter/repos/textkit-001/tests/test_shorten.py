from textkit import shorten


def test_fits_unchanged():
    assert shorten("Hello   world", 20) == "Hello world"


def test_truncates_on_word_boundary():
    assert shorten("The quick brown fox jumps", 16) == "The quick [...]"


def test_placeholder_only_when_first_word_too_long():
    assert shorten("Supercalifragilistic word", 12) == "[...]"
