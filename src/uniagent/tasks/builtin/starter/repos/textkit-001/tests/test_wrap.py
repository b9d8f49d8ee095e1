import pytest

from textkit import fill, wrap


def test_short_text_is_single_line():
    assert wrap("hello world", 40) == ["hello world"]


def test_wraps_on_word_boundaries():
    assert wrap("the quick brown fox jumps over the lazy dog", 13) == [
        "the quick",
        "brown fox",
        "jumps over",
        "the lazy dog",
    ]


def test_whitespace_runs_collapse():
    assert wrap("  a\t\tb \n c  ", 10) == ["a b c"]


def test_long_words_are_chopped():
    assert wrap("abcdefghij", 4) == ["abcd", "efgh", "ij"]


def test_long_words_kept_when_not_breaking():
    assert wrap("a abcdefghij b", 4, break_long_words=False) == ["a", "abcdefghij", "b"]


def test_empty_text():
    assert wrap("", 10) == []
    assert fill("   ", 10) == ""


def test_fill_joins_lines():
    assert fill("one two three", 8) == "one two\nthree"


def test_rejects_non_positive_width():
    with pytest.raises(ValueError):
        wrap("x", 0)
