"""The default `local` sandbox (real bubblewrap): isolation, limits, lifecycle, files.

The escape battery tries what a careless or hostile command would: write or read outside the
workspace, reach a host port, fork-bomb, eat memory, leave a setsid daemon behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from pathlib import Path

import pytest

from conftest import needs_bwrap, require
from uniagent import sandbox
from uniagent.errors import ConfigError, SandboxDeadError, SandboxStartError
from uniagent.sandbox import procs

pytestmark = needs_bwrap


def _pids_with_arg(arg: str) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and arg in procs.cmdline(int(p))]


async def test_create_from_dict_and_config_errors(tmp_path: Path) -> None:
    sb = sandbox.create({"workspace": str(tmp_path)})
    assert sb.kind == "local" and not await sb.alive()
    with pytest.raises(ConfigError, match=r"^sandbox\.netwrk: "):
        sandbox.create({"type": "local", "netwrk": True})
    with pytest.raises(ConfigError, match="type"):
        sandbox.create({"type": "nope"})


async def test_basic_layout_and_scrubbed_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UA_TEST_SECRET_TOKEN", "sk-do-not-leak")
    cfg = {"workspace": str(tmp_path), "env": {"TASK_VAR": "v1"}}
    async with sandbox.create(cfg) as sb:
        r = await sb.exec("pwd; hostname; env | sort; ls /proc | grep -c '^[0-9]'")
        assert r.ok, r.output
        lines = r.output.splitlines()
        assert lines[0] == "/workspace" and lines[1] == "sandbox"
        assert "TASK_VAR=v1" in r.output and "sk-do-not-leak" not in r.output
        assert int(lines[-1]) < 10, "a private PID namespace shows only the sandbox's processes"
        r = await sb.exec("python -c 'import pytest, sys; print(sys.version_info[0])'")
        assert r.output.strip() == "3", r.output
        r = await sb.exec("wc -c < /etc/shadow")
        assert r.output.strip() in ("0", "") or "Permission denied" in r.output


async def test_escape_write_outside_workspace(tmp_path: Path) -> None:
    marker = f"ua-escape-{secrets.token_hex(4)}"
    async with sandbox.create({"workspace": str(tmp_path / "ws")}) as sb:
        for target in (f"/etc/{marker}", f"/usr/{marker}", f"/{marker}", f"/.uniagent/bin/{marker}"):
            r = await sb.exec(f"echo x > {target}")
            assert r.exit_code != 0, f"wrote {target}: {r.output}"
        r = await sb.exec(f"echo x > /tmp/{marker} && echo x > /workspace/{marker} && echo ok")
        assert r.output.strip() == "ok"
    assert not Path(f"/tmp/{marker}").exists(), "the sandbox's /tmp is private"
    assert not Path(f"/etc/{marker}").exists() and not Path(f"/{marker}").exists()
    assert (tmp_path / "ws" / marker).exists(), "the workspace is the one writable host path"


async def test_escape_read_secret_outside_workspace(tmp_path: Path) -> None:
    secret = Path(f"/tmp/ua-secret-{secrets.token_hex(4)}")
    secret.write_text("TOP-SECRET-VALUE")
    home_secret = Path.home() / f".ua-secret-{secrets.token_hex(4)}"
    home_secret.write_text("TOP-SECRET-VALUE")
    here = Path(__file__).resolve()
    try:
        async with sandbox.create({"workspace": str(tmp_path)}) as sb:
            for p in (secret, home_secret, here):
                r = await sb.exec(f"cat {p}")
                assert r.exit_code != 0 and "TOP-SECRET" not in r.output and "escape battery" not in r.output
            # A symlink planted in the workspace must not make the host read or write its target.
            # Refusing is fine; returning the host file (or quoting it in the error) is not.
            await sb.exec(f"ln -s {secret} leak; ln -s {home_secret} plant")
            try:
                data = await sb.read_file("leak")
            except Exception as exc:  # any refusal will do
                data = str(exc).encode()
            assert b"TOP-SECRET" not in data, "read the host file through a planted link"
            with contextlib.suppress(Exception):  # any refusal will do
                await sb.write_file("plant", b"overwritten")
            assert home_secret.read_text() == "TOP-SECRET-VALUE", "wrote the host file through a planted link"
    finally:
        secret.unlink()
        home_secret.unlink()


async def test_escape_network_egress_to_host_loopback(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"
    probe = f'python -c "{connect}"'
    try:
        async with sandbox.create({"workspace": str(tmp_path)}) as sb:
            r = await sb.exec(probe, timeout=10)
            assert "CONNECTED" not in r.output and r.exit_code != 0
            r = await sb.exec("ip -o link 2>/dev/null || cat /proc/net/dev")
            assert "eth" not in r.output, "only loopback exists without `network: true`"
        async with sandbox.create({"workspace": str(tmp_path), "network": True}) as sb:
            r = await sb.exec(probe, timeout=10)
            assert "CONNECTED" in r.output, "positive control: network on reaches the port"
    finally:
        server.close()


async def test_escape_fork_bomb_is_contained(tmp_path: Path) -> None:
    cfg = {"workspace": str(tmp_path), "limits": {"pids": 64}}
    async with sandbox.create(cfg) as sb:
        cg = sb._cgroup  # type: ignore[attr-defined]
        why = "no writable pids cgroup here (cgroup v2 with delegation, or v1 pids, is needed)"
        require("the pids cgroup", cg is not None and "pids" in cg.applied, why)
        r = await sb.exec("bomb() { bomb | bomb & }; bomb", timeout=3)
        assert r.timed_out or r.exit_code is not None
        assert len(cg.pids()) <= 64
        pids = set(cg.pids())
        name = cg.name
    time.sleep(0.2)

    def in_sandbox_cgroup(pid: int) -> bool:
        try:
            return name in Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False

    # (pids are checked through their cgroup: on a busy machine a number can be reused)
    assert not [p for p in pids if in_sandbox_cgroup(p)], "stop kills every process of the bomb"
    assert not [d for d in cg.dirs if d.exists()], "and removes its cgroups"
    assert os.fork is not None and (await asyncio.create_subprocess_exec("true")).pid > 0


async def test_escape_memory_bomb_is_contained(tmp_path: Path) -> None:
    cfg = {"workspace": str(tmp_path), "limits": {"memory_mb": 128}}
    async with sandbox.create(cfg) as sb:
        r = await sb.exec(
            'python -c \'x = bytearray(1 << 30); x[::4096] = b"1" * len(x[::4096]); print("ALLOC")\''
        )
        assert "ALLOC" not in r.output.splitlines() and r.exit_code != 0, r.output
        r = await sb.exec("echo still here")
        assert r.output.strip().endswith("still here"), "the sandbox survives its memory bomb"


async def test_escape_setsid_orphan_dies_on_stop(tmp_path: Path) -> None:
    tag = f"{secrets.randbelow(10**6) + 10**6}.25"
    async with sandbox.create({"workspace": str(tmp_path)}) as sb:
        await sb.exec(
            f"setsid sleep {tag} > /dev/null 2>&1 & nohup sleep {tag} > /dev/null 2>&1 & disown; true"
        )
        await sb.exec(f"setsid bash -c 'setsid sleep {tag} & exec sleep {tag}' >/dev/null 2>&1 &")
        deadline = time.monotonic() + 5
        while len(_pids_with_arg(tag)) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(_pids_with_arg(tag)) >= 4
    deadline = time.monotonic() + 5
    while _pids_with_arg(tag) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _pids_with_arg(tag) == [], "daemons that called setsid do not survive stop"


async def test_rlimits_file_size_and_open_files(tmp_path: Path) -> None:
    cfg = {"workspace": str(tmp_path), "limits": {"file_size_mb": 1, "open_files": 64, "cpu_time_s": 1}}
    async with sandbox.create(cfg) as sb:
        r = await sb.exec("ulimit -n; ulimit -t")
        assert r.output.split() == ["64", "1"]
        r = await sb.exec("head -c 3000000 /dev/zero > big; ls -l big | awk '{print $5}'")
        assert r.output.strip().splitlines()[-1] == str(1 << 20)
        r = await sb.exec("python -c 'while True: pass'", timeout=30)
        assert r.exit_code not in (0, None) and not r.timed_out, "RLIMIT_CPU stops a CPU hog"


async def test_timeout_interrupts_and_session_survives(tmp_path: Path) -> None:
    async with sandbox.create({"workspace": str(tmp_path)}) as sb:
        await sb.exec("export KEEP=1; cd /tmp")
        t0 = time.monotonic()
        r = await sb.exec("sleep 100", timeout=0.5)
        assert r.timed_out and "timed out after 0.5s" in r.output
        assert time.monotonic() - t0 < 5
        r = await sb.exec("echo $KEEP; pwd")
        assert r.output.split() == ["1", "/tmp"]
        assert not [p for p in _pids_with_arg("100") if "sleep" in procs.cmdline(p)[0]]


async def test_killed_shell_restarts_and_killed_sandbox_is_dead(tmp_path: Path) -> None:
    async with sandbox.create({"workspace": str(tmp_path)}) as sb:
        await sb.exec("cd /tmp")
        r = await sb.exec("kill -9 $$")
        r = await sb.exec("pwd")
        assert "new shell" in r.output and r.output.strip().endswith("/tmp")
        sb._proc.kill()  # type: ignore[union-attr]
        await asyncio.sleep(0.2)
        assert not await sb.alive()
        with pytest.raises(SandboxDeadError):
            await sb.exec("echo hi")


async def test_wall_clock_limit_stops_the_sandbox(tmp_path: Path) -> None:
    async with sandbox.create({"workspace": str(tmp_path), "limits": {"wall_clock_s": 0.5}}) as sb:
        assert await sb.alive()
        await asyncio.sleep(1.0)
        assert not await sb.alive()


async def test_files_binary_safe_inside_and_outside_workspace(tmp_path: Path) -> None:
    blob = bytes(range(256)) * 512 + b"\x00\r\n\x1b[31m"
    async with sandbox.create({"workspace": str(tmp_path / "ws")}) as sb:
        await sb.write_file("sub/blob.bin", blob)
        assert (tmp_path / "ws" / "sub" / "blob.bin").read_bytes() == blob
        assert await sb.read_file("/workspace/sub/blob.bin") == blob
        await sb.write_file("/tmp/blob.bin", blob, mode=0o600)
        assert await sb.read_file("/tmp/blob.bin") == blob
        r = await sb.exec(
            "stat -c %a /tmp/blob.bin; sha256sum /tmp/blob.bin sub/blob.bin | awk '{print $1}' | uniq | wc -l"
        )
        assert r.output.split() == ["600", "1"]
        src = tmp_path / "tree"
        (src / "a" / "b").mkdir(parents=True)
        (src / "a" / "b" / "f.txt").write_text("deep")
        (src / "top.bin").write_bytes(blob)
        await sb.upload(src, "/tmp/up")
        await sb.upload(src, "up")
        r = await sb.exec("cat /tmp/up/a/b/f.txt up/a/b/f.txt")
        assert r.output == "deepdeep"
        await sb.download("/tmp/up", tmp_path / "down1")
        await sb.download("up", tmp_path / "down2")
        for d in ("down1", "down2"):
            assert (tmp_path / d / "a" / "b" / "f.txt").read_text() == "deep"
            assert (tmp_path / d / "top.bin").read_bytes() == blob


async def test_missing_bwrap_is_a_typed_start_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without bubblewrap on it
    with pytest.raises(SandboxStartError, match="bubblewrap"):
        await sandbox.create({"workspace": str(tmp_path), "start_retries": 0}).start()


async def test_hundred_sandboxes_concurrently_leave_nothing_behind() -> None:
    fds_before = len(os.listdir("/proc/self/fd"))
    kids_before = procs.descendants(os.getpid())
    sem = asyncio.Semaphore(100)
    boxes: list[sandbox.Sandbox] = []

    async def one(i: int) -> str:
        async with sem, sandbox.create({}) as sb:
            boxes.append(sb)
            r = await sb.exec(f"echo {i} > f; cat f; sleep 0.05 & setsid sleep 30 &")
            return r.output.strip()

    t0 = time.monotonic()
    outs = await asyncio.gather(*(one(i) for i in range(100)))
    elapsed = time.monotonic() - t0
    assert outs == [str(i) for i in range(100)]
    await asyncio.sleep(0.3)
    for sb in boxes:
        assert not sb.workspace.exists() and not sb._ctl.exists(), "temp dirs removed"  # type: ignore[attr-defined]
        assert sb._cgroup is None or not [d for d in sb._cgroup.dirs if d.exists()]  # type: ignore[attr-defined]
    assert procs.descendants(os.getpid()) == kids_before, "no leaked processes"
    fds_after = len(os.listdir("/proc/self/fd"))
    assert fds_after <= fds_before + 2, f"file descriptors: {fds_before} -> {fds_after}"
    print(f"100 sandboxes at once: {elapsed:.1f}s")


async def test_sandboxes_share_one_cpu_group_of_the_controllers_weight(tmp_path: Path) -> None:
    """Every sandbox's processes sit in one cpu cgroup per controller process (default weight),
    not each in a scheduler autogroup of its own: 1,000 busy sandboxes then weigh what the
    controller does instead of 1,000 times more (its event loop lagged seconds at 1,000)."""
    from uniagent.sandbox import cgroups

    shared = cgroups.shared_cpu_group()
    require("a writable v1 cpu cgroup", shared is not None, "no cgroup v1 cpu controller to write here")
    assert shared is not None and (shared / "cpu.shares").read_text().strip() == "1024"
    async with (
        sandbox.create({"workspace": str(tmp_path)}) as sb,
        sandbox.create({"workspace": str(tmp_path / "b")}) as sb2,
    ):
        r = await sb.exec("sleep 30 & echo $!", timeout=10)
        await sb2.exec("true", timeout=10)
        members = {int(x) for x in (shared / "cgroup.procs").read_text().split()}
        inits = {sb._init_pid, sb2._init_pid}  # type: ignore[attr-defined]
        assert inits <= members, "both sandboxes' processes are in the shared group"
        assert len(members) >= 4 and r.ok
    left = {int(x) for x in (shared / "cgroup.procs").read_text().split()}
    assert not (left & inits), "a stopped sandbox leaves the shared group"
    assert shared.exists(), "the group is the process's, removed at exit"


def test_reap_removes_a_dead_controllers_shared_cpu_group() -> None:
    from uniagent.sandbox import cgroups

    base = cgroups._base("cpu")
    dead = 2**22 + 7  # above pid_max here: no such process
    shared = base / f"uniagent-{dead}-sandboxes"
    try:
        (shared / f"uniagent-{dead}-abc123").mkdir(parents=True)
    except OSError:
        require("a writable v1 cpu cgroup", False, "no cgroup v1 cpu controller to write here")
    removed = cgroups.reap_orphans()
    assert not shared.exists() and shared in removed


def test_a_cgroup_still_busy_at_stop_is_removed_later() -> None:
    """On a saturated machine a killed process can sit in its cgroup for a while (a zombie not
    yet reaped): the cgroup is retried by the next sandbox's cgroup, not left for good."""
    import subprocess

    from uniagent.sandbox import cgroups

    cg = cgroups.SandboxCgroup(cgroups.cgroup_name(secrets.token_hex(6)), None, 16, None)
    require("a writable pids cgroup", "pids" in cg.applied, "no cgroup pids controller to write here")
    d = cg.dirs[0]
    proc = subprocess.Popen(["sleep", "30"])
    try:
        (d / "cgroup.procs").write_text(str(proc.pid))
        cg.remove()
        assert d.exists() and d in cgroups._leftover, "busy: kept for a later try"
    finally:
        proc.kill()
        proc.wait()
    later = cgroups.SandboxCgroup(cgroups.cgroup_name(secrets.token_hex(6)), None, 16, None)
    later.remove()
    assert not d.exists() and d not in cgroups._leftover


async def test_a_slow_bubblewrap_start_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bwrap that needs seconds to build its sandbox (a saturated machine) is waited for up to
    `start_timeout_s`, not failed after a fixed ~1 s poll (10 of 1,008 episodes ended
    `sandbox_dead` that way in the kill -9 / --resume bench)."""
    from uniagent.sandbox import local

    sh, flag, script, name = local.INIT_ARGV
    monkeypatch.setattr(local, "INIT_ARGV", (sh, flag, f"sleep 1.6; {script}", name))  # built after 1.6 s
    async with sandbox.create({"workspace": str(tmp_path), "start_retries": 0}) as sb:
        assert (await sb.exec("echo ok", timeout=10)).output == "ok\n"


async def test_start_waits_for_init_by_its_ready_line_not_by_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start learns that the sandbox is built from a line its init prints, not by polling
    /proc on the event loop (dozens of reads per start, every start); a bwrap that fails still
    says why."""
    from uniagent.sandbox import local

    calls: list[int] = []
    real = local.procs.children
    monkeypatch.setattr(local.procs, "children", lambda pid: calls.append(pid) or real(pid))
    sh, flag, script, name = local.INIT_ARGV
    monkeypatch.setattr(local, "INIT_ARGV", (sh, flag, f"sleep 0.5; {script}", name))
    async with sandbox.create({"workspace": str(tmp_path / "ws"), "start_retries": 0}) as sb:
        assert (await sb.exec("echo ok", timeout=10)).output == "ok\n"
        assert calls.count(sb._proc.pid) == 1
    monkeypatch.setattr(local, "bwrap_args", lambda *a: ["--no-such-option"])
    with pytest.raises(SandboxStartError, match=r"bubblewrap did not start: .*no-such-option"):
        await sandbox.create({"workspace": str(tmp_path / "ws2"), "start_retries": 0}).start()


async def test_stop_removes_its_dirs_with_one_rm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop removes the control dir and its own workspace (not a given one, nor one it was told to
    keep) with a single `rm` child: each spawn costs the controller CPU."""
    from uniagent.sandbox import local

    removals: list[tuple[str, ...]] = []
    real = local.procs.spawn

    async def spawn(*argv: str, **kwargs: object) -> asyncio.subprocess.Process:
        if argv[0] == "rm":
            removals.append(argv)
        return await real(*argv, **kwargs)

    monkeypatch.setattr(local.procs, "spawn", spawn)
    for cfg, ws_removed in (
        ({}, True),
        ({"keep_workspace": True}, False),
        ({"workspace": str(tmp_path)}, False),
    ):
        removals.clear()
        sb = sandbox.create({"start_retries": 0, **cfg})
        await sb.start()
        await sb.write_file("f.txt", "x")
        ctl, ws = sb._ctl, sb.workspace
        await sb.stop()
        assert len(removals) == 1 and not ctl.exists()
        assert ws.exists() != ws_removed and (str(ws) in removals[0]) == ws_removed
        if not ws_removed and ws != tmp_path:
            await local._remove_trees(ws)
