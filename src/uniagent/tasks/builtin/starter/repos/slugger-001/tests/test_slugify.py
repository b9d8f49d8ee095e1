import pytest

from slugger import slugify


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        pytest.param("Hello World", "hello-world", id="basic"),
        pytest.param("  Leading and trailing  ", "leading-and-trailing", id="strip"),
        pytest.param("snake_case/and.dots", "snake-case-and-dots", id="separators"),
        pytest.param("Rock & Roll", "rock-and-roll", id="ampersand"),
        pytest.param("What?! No way...", "what-no-way", id="punctuation"),
        pytest.param("100% Pure", "100-percent-pure", id="percent"),
    ],
)
def test_slugify(title, expected):
    assert slugify(title) == expected


def test_custom_separator():
    assert slugify("Hello Big World", separator="_") == "hello_big_world"


def test_max_length_cuts_on_word_boundary():
    assert slugify("the quick brown fox", max_length=12) == "the-quick"


def test_max_length_rejects_zero():
    with pytest.raises(ValueError):
        slugify("x", max_length=0)


def test_only_symbols_gives_empty_slug():
    assert slugify("!!!") == ""
