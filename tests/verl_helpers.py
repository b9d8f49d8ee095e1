"""Helpers shared by the verl command tests."""

from __future__ import annotations

import re
import shlex


def printed_command(output: str) -> tuple[dict[str, str], list[str]]:
    """A printed command's environment (the `NAME=value` items in front) and the command itself."""
    items = shlex.split(output.strip().splitlines()[-1])
    n = next(i for i, item in enumerate(items) if not re.match(r"[A-Z_][A-Z0-9_]*=", item))
    return dict(item.split("=", 1) for item in items[:n]), items[n:]
