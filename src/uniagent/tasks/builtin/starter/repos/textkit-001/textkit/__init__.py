"""Small helpers for laying out plain text in terminals and e-mails."""

from textkit.shorten import shorten
from textkit.wrap import fill, wrap

__all__ = ["fill", "shorten", "wrap"]
