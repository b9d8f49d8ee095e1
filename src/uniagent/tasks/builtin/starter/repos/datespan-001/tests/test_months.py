from datetime import date

import pytest

from datespan import add_months, end_of_month, months_between


def test_add_months_simple():
    assert add_months(date(2023, 3, 15), 2) == date(2023, 5, 15)


def test_add_months_clamps_to_short_month():
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2023, 8, 31), 1) == date(2023, 9, 30)


def test_add_months_across_year_end():
    assert add_months(date(2022, 11, 15), 3) == date(2023, 2, 15)
    assert add_months(date(2023, 1, 10), -1) == date(2022, 12, 10)


def test_add_months_out_of_range():
    with pytest.raises(OverflowError):
        add_months(date(9999, 12, 1), 1)


def test_end_of_month():
    assert end_of_month(date(2024, 2, 3)) == date(2024, 2, 29)


def test_months_between():
    assert months_between(date(2023, 1, 15), date(2023, 4, 14)) == 2
    assert months_between(date(2023, 1, 15), date(2023, 4, 15)) == 3
    assert months_between(date(2023, 4, 15), date(2023, 1, 15)) == -3
