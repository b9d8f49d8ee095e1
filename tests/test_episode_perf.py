"""Behaviour of the episode path's speed-ups (issue 14, part 2). Not timed: each test checks
what a speed-up must keep true (limits still hold, the same base commit, nothing left behind).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from conftest import needs_bwrap
from uniagent import sandbox
from uniagent.sandbox import procs


@needs_bwrap
async def test_local_sandbox_spawns_without_preexec_fn_and_keeps_its_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preexec_fn makes Python fork() its whole address space (page tables copied, the event
    loop blocked until exec); the cgroups and rlimits are set by an exec'd launcher instead."""
    seen: list[dict[str, Any]] = []
    real = procs.spawn

    async def spy(*argv: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        seen.append({"argv": argv, **kwargs})
        return await real(*argv, **kwargs)

    monkeypatch.setattr(procs, "spawn", spy)
    cfg = {"workspace": str(tmp_path), "limits": {"open_files": 333, "file_size_mb": 3}}
    async with sandbox.create(cfg) as sb:
        res = await sb.exec("ulimit -n; grep 'Max file size' /proc/self/limits")
        cgroup = sb._cgroup
        shell = sb._shell_host_pid(sb._sessions["default"])
        members = cgroup.pids() if cgroup is not None else set()
    assert seen and all(s.get("preexec_fn") is None for s in seen), [s.get("preexec_fn") for s in seen]
    lines = res.output.split()
    assert lines[0] == "333" and lines[4] == str(3 << 20), res.output
    if cgroup is not None and cgroup.applied:  # the shell runs in the sandbox's own cgroup
        assert shell in members, (shell, members)
    assert not any(os.path.exists(d) for d in (cgroup.dirs if cgroup else [])), "cgroups removed"
