"""Human-friendly durations: ``"1h30m"`` <-> ``5400`` seconds."""

from durations.core import DurationError, format_duration, parse_duration

__all__ = ["DurationError", "format_duration", "parse_duration"]
