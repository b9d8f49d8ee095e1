"""Money as integer cents: parsing, rounding, formatting and fair splitting."""

from money.amounts import format_cents, round_amount, to_cents
from money.split import allocate, split_evenly

__all__ = ["allocate", "format_cents", "round_amount", "split_evenly", "to_cents"]
