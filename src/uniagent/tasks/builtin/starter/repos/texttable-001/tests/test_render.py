import pytest

from texttable import format_cell, render


def test_docstring_example():
    table = render(["fruit", "qty"], [["apple", 3], ["kiwi", 120]])
    assert table.splitlines() == [
        "fruit | qty",
        "------+----",
        "apple |   3",
        "kiwi  | 120",
    ]


def test_custom_separator():
    table = render(["a", "b"], [["xx", "yy"]], separator="  ")
    assert table.splitlines() == ["a   b", "------", "xx  yy"]


def test_shape_mismatch():
    with pytest.raises(ValueError, match="row 2"):
        render(["a", "b"], [[1, 2], [3]])


def test_no_columns():
    with pytest.raises(ValueError):
        render([], [])


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, ""), (True, "yes"), (1.5, "1.50"), (7, "7"), ("two\nlines", "two lines")],
)
def test_format_cell(value, text):
    assert format_cell(value) == text
