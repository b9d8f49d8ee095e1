from datetime import date

from datespan import billing_periods, quarter_of


def test_monthly_periods_from_the_31st():
    assert billing_periods(date(2023, 1, 31), 3) == [
        (date(2023, 1, 31), date(2023, 2, 27)),
        (date(2023, 2, 28), date(2023, 3, 30)),
        (date(2023, 3, 31), date(2023, 4, 29)),
    ]


def test_quarterly_periods():
    assert billing_periods(date(2023, 2, 1), 2, every=3) == [
        (date(2023, 2, 1), date(2023, 4, 30)),
        (date(2023, 5, 1), date(2023, 7, 31)),
    ]


def test_quarter_of():
    assert [quarter_of(date(2023, m, 1)) for m in (1, 3, 4, 9, 10, 12)] == [1, 1, 2, 3, 4, 4]
