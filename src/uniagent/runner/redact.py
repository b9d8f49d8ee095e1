"""Secrets never reach the store, the logs or the dashboard.

Values of environment variables whose names look secret (KEY, TOKEN, SECRET, PASSWORD,
CREDENTIAL), and any extra values the run knows about, are replaced wherever they appear.
"""

from __future__ import annotations

import os
import re
from typing import Any

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)
MASK = "[REDACTED]"


class Redactor:
    def __init__(self, extra: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        values = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= 8}
        values |= {v for v in extra or [] if v and len(v) >= 4}
        self.values = sorted(values, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in self.values)) if self.values else None

    def text(self, s: str) -> str:
        return self._pattern.sub(MASK, s) if self._pattern and s else s

    def data(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {k: self.data(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.data(v) for v in obj]
        return obj
