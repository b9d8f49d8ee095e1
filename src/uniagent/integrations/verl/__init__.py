"""uniagent inside verl: `UniAgentLoop` (an `AgentLoopBase`), `VerlEngine`, data prep and launch recipes.

Nothing here imports verl at package import time: `uniagent` registers this package's CLI commands on
every start, and verl (with torch, ray, vllm) is only needed when a verl command or the agent loop runs.
Import `uniagent.integrations.verl.loop` for the agent loop itself.
"""

from uniagent.integrations.verl.engine import VerlEngine

__all__ = ["VerlEngine"]

SUPPORTED_VERL = (0, 9)
"""verl minor release this integration is written against (`verl>=0.9.1,<0.10` in pyproject)."""


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor`: verl imports, is a 0.9.x release, and `UniAgentLoop` loads against it.
    verl is optional (`uniagent[verl]`): not installed is `None`."""
    import asyncio
    import importlib
    import importlib.util

    name = "trainer verl"
    if importlib.util.find_spec("verl") is None:
        return [(name, None, "not installed: pip install 'uniagent[verl]'")]
    try:
        verl = await asyncio.to_thread(importlib.import_module, "verl")
        version = str(getattr(verl, "__version__", "?"))
        if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) != SUPPORTED_VERL:
            want = ".".join(map(str, SUPPORTED_VERL))
            return [(name, False, f"verl {version} installed; uniagent supports {want}.x")]
        await asyncio.to_thread(importlib.import_module, "uniagent.integrations.verl.loop")
    except Exception as exc:
        return [(name, False, f"import failed: {type(exc).__name__}: {str(exc)[:160]}")]
    return [(name, True, f"verl {version}; UniAgentLoop loads")]
