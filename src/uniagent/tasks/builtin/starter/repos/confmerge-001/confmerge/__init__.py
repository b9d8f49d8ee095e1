"""Layered configuration: built-in defaults < explicit overrides < environment."""

from confmerge.defaults import DEFAULTS
from confmerge.loader import deep_merge, load

__all__ = ["DEFAULTS", "deep_merge", "load"]
