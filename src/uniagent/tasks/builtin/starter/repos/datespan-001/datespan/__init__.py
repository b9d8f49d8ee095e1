"""Calendar-month arithmetic (billing cycles, subscription renewals)."""

from datespan.months import add_months, end_of_month, months_between
from datespan.periods import billing_periods, quarter_of

__all__ = ["add_months", "billing_periods", "end_of_month", "months_between", "quarter_of"]
