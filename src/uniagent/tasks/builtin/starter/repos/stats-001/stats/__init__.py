"""Descriptive statistics for small in-memory samples."""

from stats.describe import Summary, iqr, mean, median, percentile, summarize

__all__ = ["Summary", "iqr", "mean", "median", "percentile", "summarize"]
