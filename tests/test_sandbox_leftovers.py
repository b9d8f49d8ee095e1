"""The session-end leftover check (tests/leftovers.py, wired in tests/conftest.py) finds what a
test leaked, even once it was reparented to init, and nothing that is not ours (real processes,
a real bubblewrap sandbox)."""

from __future__ import annotations

import os
import subprocess
import time

import leftovers
from conftest import needs_bwrap
from uniagent import sandbox
from uniagent.sandbox import procs


def _orphan(env: dict[str, str]) -> int:
    """A `sleep` whose parent exited, so that init adopted it; its pid."""
    out = subprocess.run(
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def test_finds_an_orphan_that_carries_the_marker_and_nothing_else() -> None:
    marker = os.environ[leftovers.MARKER]  # set by conftest when the session began
    ours = _orphan(dict(os.environ))
    theirs = _orphan({"PATH": os.environ["PATH"], leftovers.MARKER: "another-session"})
    try:
        found = leftovers.leftover_processes(marker)
        assert ours in found and theirs not in found
        assert "sleep 60" in leftovers.describe(ours)
    finally:
        leftovers.kill([ours, theirs])
    deadline = time.monotonic() + 3
    while ours in leftovers.leftover_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ours not in leftovers.leftover_processes(marker)


@needs_bwrap
async def test_finds_a_sandbox_left_running_until_it_is_stopped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = os.environ[leftovers.MARKER]
    sb = sandbox.create({"workspace": str(tmp_path / "ws")})
    await sb.start()
    try:
        found = leftovers.leftover_processes(marker)
        ws = str(tmp_path / "ws")
        bwraps = [p for p in found if procs.cmdline(p)[:1] and procs.cmdline(p)[0].endswith("bwrap")]
        assert any(ws in procs.cmdline(p) for p in bwraps), [leftovers.describe(p) for p in found]
    finally:
        await sb.stop()
    assert not [p for p in leftovers.settle(marker) if str(tmp_path / "ws") in " ".join(procs.cmdline(p))]
