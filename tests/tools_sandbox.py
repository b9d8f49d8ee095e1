"""The sandbox the tool tests run in: the isolated `local` backend (bubblewrap) when it is
available, else the host backend (no isolation: only for these tests' own commands)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from uniagent import sandbox
from uniagent.sandbox import Sandbox


def sandbox_config(workspace: Path) -> dict[str, Any]:
    """A sandbox whose working directory is `workspace` on this machine.

    UNIAGENT_TEST_SANDBOX=host forces the host backend (to compare the two).
    """
    if os.environ.get("UNIAGENT_TEST_SANDBOX") == "host":
        return {"type": "host", "workdir": str(workspace), "i_understand_there_is_no_isolation": True}
    try:
        import uniagent.sandbox.local  # noqa: F401
    except ImportError:
        return {"type": "host", "workdir": str(workspace), "i_understand_there_is_no_isolation": True}
    return {"type": "local", "workspace": str(workspace)}


@asynccontextmanager
async def open_sandbox(workspace: Path, **extra: Any) -> AsyncIterator[Sandbox]:
    async with sandbox.create({**sandbox_config(workspace), **extra}) as box:
        yield box
