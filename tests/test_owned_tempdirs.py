"""Host temp dirs carry their owner's pid, and a later process removes those of dead owners.

A run killed with -9 cannot stop its sandboxes, so their workspace and control dirs stayed in
the temp dir forever; the next process's first sandbox start now sweeps them (issue 14).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import needs_bwrap
from uniagent.sandbox import procs

START_ONE = textwrap.dedent(
    """
    import asyncio, sys
    from uniagent.sandbox import create

    async def main():
        async with create({"type": "local"}) as sb:
            print(sb.workspace, sb._ctl)
            assert (await sb.exec("echo ok")).output.strip() == "ok"

    asyncio.run(main())
    """
)


def _dead_pid() -> int:
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


@needs_bwrap
def test_a_dead_owners_ws_and_ctl_dirs_are_removed_by_the_next_process_first_start(tmp_path: Path) -> None:
    dead, live = _dead_pid(), os.getpid()
    made = {}
    for kind in ("ws", "ctl"):
        for owner, pid in (("dead", dead), ("live", live)):
            d = tmp_path / f"uniagent-{kind}-{pid}-x{owner}"
            (d / "sub").mkdir(parents=True)
            (d / "sub" / "f").write_text("left by a killed run")
            made[(kind, owner)] = d
    other = tmp_path / "uniagent-ws-notapid"
    other.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-c", START_ONE]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ws, ctl = (Path(p) for p in out.stdout.split())
    child = procs.owner_of(ws.name, "uniagent-ws-")  # uniagent-ws-<pid>-..., uniagent-ctl-<pid>-...
    assert child not in (None, live) and procs.owner_of(ctl.name, "uniagent-ctl-") == child
    assert not ws.exists() and not ctl.exists()  # stopped: its own dirs are gone
    for (_kind, owner), d in made.items():
        assert d.exists() == (owner == "live"), d
    assert other.exists()  # not an owner-pid name: not ours to judge


def test_owned_tempdir_names_the_owner_and_sweeps_once_per_prefix(tmp_path: Path) -> None:
    dead = tmp_path / f"uniagent-t-{_dead_pid()}-old"
    dead.mkdir()
    first = procs.owned_tempdir("uniagent-t-", tmp_path)
    assert procs.owner_of(first.name, "uniagent-t-") == os.getpid()
    assert not dead.exists()
    second = procs.owned_tempdir("uniagent-t-", tmp_path)  # no second sweep: ours are kept
    assert first.is_dir() and second.is_dir() and first != second
    assert procs.owner_of("uniagent-123-abc", "uniagent-") == 123
    assert procs.owner_of("uniagent-ws-abc", "uniagent-ws-") is None
    assert procs.pid_alive(os.getpid()) and not procs.pid_alive(_dead_pid())
