"""Plain-text tables for CLI output."""

from texttable.render import format_cell, render

__all__ = ["format_cell", "render"]
