"""Read and write ``key = value`` settings files."""

from kvparse.parser import ParseError, loads
from kvparse.writer import dumps

__all__ = ["ParseError", "dumps", "loads"]
