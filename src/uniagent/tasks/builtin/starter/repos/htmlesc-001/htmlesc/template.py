"""``Template("<p>{name}</p>").render(name=...)`` with automatic escaping."""

from __future__ import annotations

import re
from typing import Any

from htmlesc.escape import Markup, escape

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(\|raw)?\}")


class Template:
    def __init__(self, source: str) -> None:
        self.source = source
        self.fields = [m.group(1) for m in _FIELD.finditer(source)]

    def render(self, **values: Any) -> Markup:
        missing = [f for f in self.fields if f not in values]
        if missing:
            raise KeyError(f"missing template values: {', '.join(sorted(set(missing)))}")

        def substitute(match: re.Match[str]) -> str:
            value = values[match.group(1)]
            return str(value) if match.group(2) else escape(value)

        return Markup(_FIELD.sub(substitute, self.source))
