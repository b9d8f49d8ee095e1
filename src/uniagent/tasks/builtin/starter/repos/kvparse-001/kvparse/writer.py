"""Serialise a mapping back into the ``key = value`` format."""

from __future__ import annotations

from collections.abc import Mapping

_NEEDS_QUOTES = set('#"\\\n\t') | {" "}


def _quote(value: str) -> str:
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    )
    return f'"{escaped}"'


def dumps(settings: Mapping[str, str]) -> str:
    """Render ``settings`` so that ``loads(dumps(settings)) == settings``."""
    lines = []
    for key, value in settings.items():
        text = str(value)
        if not text or text != text.strip() or any(ch in _NEEDS_QUOTES for ch in text):
            text = _quote(text)
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + ("\n" if lines else "")
