import pytest

from money import format_cents, round_amount, to_cents


@pytest.mark.parametrize(
    ("raw", "cents"),
    [
        ("10", 1000),
        ("10.50", 1050),
        ("$1,234.00", 123400),
        ("-$3.25", -325),
        (".5", 50),
        (7, 700),
        (2.5, 250),
    ],
)
def test_to_cents(raw, cents):
    assert to_cents(raw) == cents


@pytest.mark.parametrize("raw", ["", "abc", "1.2.3", "$-4"])
def test_to_cents_rejects_garbage(raw):
    with pytest.raises(ValueError):
        to_cents(raw)


def test_round_amount_basic():
    assert round_amount(3.14159) == 3.14
    assert round_amount(-0.126) == -0.13


def test_format_cents():
    assert format_cents(123456) == "$1,234.56"
    assert format_cents(-5) == "-$0.05"
    assert format_cents(0, symbol="EUR ") == "EUR 0.00"
