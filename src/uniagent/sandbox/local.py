"""The default sandbox: bubblewrap, unprivileged, no network, writes only its workspace.

Layout inside: a read-only root built from the host's system directories (or a given rootfs),
the workspace bound read-write at `workdir`, a private /tmp, /proc and /dev of its own, the
tools directory at /.uniagent/bin, and uniagent's Python environment read-only (so `python`
has pytest). New user, PID, IPC, UTS, network and cgroup namespaces; capabilities dropped;
environment scrubbed to an allowlist.

bwrap's first child is the PID namespace's init: when the sandbox stops, bwrap dies, init
gets SIGKILL (--die-with-parent) and the kernel kills every process in the namespace,
including daemons that called setsid. Shell sessions enter the namespaces with nsenter, so
any number of them share one filesystem view, and a stuck one can be killed alone.

This module is the sandbox's lifecycle, sessions and files; how bwrap and every process
started inside are launched (argv, environment, cgroups, rlimits, nice) is sandbox/bwrap.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
from pathlib import Path

from uniagent.errors import SandboxDeadError, SandboxError, SandboxStartError
from uniagent.jsonio import atomic_path
from uniagent.sandbox import procs
from uniagent.sandbox.bwrap import (
    CONTROL_MOUNT,
    INIT_ARGV,
    INIT_READY,
    LocalConfig,
    bwrap_args,
    launcher,
    sandbox_env,
)
from uniagent.sandbox.cgroups import SandboxCgroup, cgroup_name
from uniagent.sandbox.pipe import PipeShellSandbox
from uniagent.sandbox.shell import ShellSession

log = logging.getLogger(__name__)

_warned: set[str] = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(msg)


async def _remove_trees(*paths: Path) -> None:
    """`rm -rf` in one child process: shutil.rmtree is a Python loop over every file that holds
    the GIL (at 1,000 episodes the largest item in the worker threads' profile), and one child
    for all of a sandbox's dirs (each spawn costs the controller ~1 ms of CPU)."""
    if not paths:
        return
    try:
        null = asyncio.subprocess.DEVNULL
        proc = await procs.spawn("rm", "-rf", "--", *map(str, paths), stdin=null, stdout=null)
        await proc.wait()
    except OSError:
        pass
    for path in paths:
        if path.exists():  # no `rm`, or it could not remove everything
            await asyncio.to_thread(shutil.rmtree, path, True)


async def _copy_tree(src: Path, dest: Path) -> None:
    """`shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)` as `cp -RP` in a child
    process (modes and times kept, links copied as links): a repository copied into every
    episode's workspace is otherwise a Python loop holding the GIL in a worker thread."""
    dest.mkdir(parents=True, exist_ok=True)
    cp = shutil.which("cp")
    if cp is not None:
        null = asyncio.subprocess.DEVNULL
        argv = [cp, "-RP", "--preserve=mode,timestamps", "--", f"{src}/.", str(dest)]
        if await procs.run_to_end(*argv, stdin=null, stdout=null, stderr=null) == 0:
            return
    await asyncio.to_thread(shutil.copytree, src, dest, symlinks=True, dirs_exist_ok=True)


class LocalSandbox(PipeShellSandbox):
    """bubblewrap on this machine. See the module docstring for what is isolated and how."""

    kind = "local"

    def __init__(self, config: LocalConfig) -> None:
        super().__init__(config)
        self.tools_dir = f"{CONTROL_MOUNT}/bin"
        self.id = secrets.token_hex(6)
        self.workspace: Path | None = None
        self._own_workspace = False
        self._ctl: Path | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._init_pid: int | None = None
        self._cgroup: SandboxCgroup | None = None
        self._shell_pids: dict[str, int] = {}

    # -- start / stop --------------------------------------------------------------------
    async def _start(self) -> None:
        cfg: LocalConfig = self.config
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxStartError(
                "bubblewrap is not installed (`apt-get install bubblewrap`); it is what isolates the "
                "default `local` sandbox. Or choose another sandbox type (container, host)."
            )
        if cfg.workspace is not None:
            self.workspace = Path(cfg.workspace).resolve()
            self.workspace.mkdir(parents=True, exist_ok=True)
        else:  # uniagent-ws-<pid>-...: a later process removes it if this one is killed with -9
            self.workspace = await asyncio.to_thread(procs.owned_tempdir, "uniagent-ws-")
            self._own_workspace = True
        self._ctl = await asyncio.to_thread(procs.owned_tempdir, "uniagent-ctl-")
        (self._ctl / "bin").mkdir()
        lim = cfg.limits
        # off the loop: a cgroup mkdir waits on the kernel's cgroup lock, seconds under load
        self._cgroup = await asyncio.to_thread(
            SandboxCgroup, cgroup_name(self.id), lim.memory_mb, lim.pids, lim.cpus
        )
        if self._cgroup.missing:
            _warn_once(
                "cgroup",
                f"cgroups for {', '.join(self._cgroup.missing)} are not available here; memory falls back "
                "to RLIMIT_AS and the process limit is not enforced"
                + "".join(f"; {why}" for why in self._cgroup.why.values()),
            )
        prefix, preexec = launcher(lim, self._cgroup)
        self._proc = await procs.spawn(
            *prefix,
            bwrap,
            *bwrap_args(cfg, self.workspace, self._ctl, self.workdir),
            *INIT_ARGV,
            stdin=asyncio.subprocess.PIPE,  # the lifeline: see INIT_ARGV
            stdout=asyncio.subprocess.PIPE,  # INIT_READY
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=preexec,
        )
        self._init_pid = await self._find_init()

    async def _find_init(self) -> int:
        """bwrap's child is init of the new PID namespace: the target sessions enter.

        Its command says when the sandbox is built (INIT_READY on bwrap's stdout), waited for up
        to `start_timeout_s` (which also bounds the whole start): on a machine saturated by 1,000
        sandboxes' work building one takes seconds. A line, not a poll of /proc: polling cost
        every start dozens of /proc reads on the event loop."""
        assert self._proc is not None and self._proc.stdout is not None
        try:
            line: bytes | None = await asyncio.wait_for(
                self._proc.stdout.readline(), self.config.start_timeout_s
            )
        except (TimeoutError, ValueError):
            line = None
        kids = procs.children(self._proc.pid) if line is not None and line.strip() == INIT_READY else []
        if kids:
            transport = getattr(self._proc, "_transport", None)  # nothing more comes: one fd less
            pipe = transport.get_pipe_transport(1) if transport is not None else None
            if pipe is not None:
                pipe.close()
            return kids[0]
        err = b""
        if line == b"" and self._proc.stderr is not None:  # stdout ended: bwrap exited
            with contextlib.suppress(TimeoutError):
                err = await asyncio.wait_for(self._proc.stderr.read(), 10)
        raise SandboxStartError(
            f"bubblewrap did not start: {err.decode(errors='replace').strip() or 'timeout'}"
        )

    async def _stop(self) -> None:
        if self._proc is not None:
            # The tree, not just bwrap: a bwrap killed mid-start leaves its init behind.
            await procs.kill_process_tree(self._proc, 10)
        await asyncio.to_thread(self._free_host)  # a cgroup's kernel lock can take seconds
        await _remove_trees(*self._doomed())

    def _free_host(self) -> None:
        """Kill what is left in the sandbox's cgroup, remove the cgroup, and (stopped mid-start)
        the stray bwrap child. Blocking."""
        if self._cgroup is not None:  # every process of the sandbox is in it: forks racing the kill too
            self._cgroup.kill_all()
            self._cgroup.remove()
        if self._init_pid is None and self._ctl is not None and not (self._cgroup and self._cgroup.dirs):
            # Stopped mid-start with no cgroup of its own: bwrap may have forked its sandbox child
            # just as it was killed (procs.kill_tree). That child waits forever for bwrap, and still
            # carries bwrap's argv, which names our control dir.
            procs.signal_pids(procs.pids_with_arg(str(self._ctl)), signal.SIGKILL)

    def _doomed(self) -> list[Path]:
        """The host directories that go with the sandbox: its control dir, and its workspace when
        it made that itself (and was not told to keep it)."""
        doomed = [self._ctl] if self._ctl is not None else []
        if self._own_workspace and self.workspace is not None and not self.config.keep_workspace:
            doomed.append(self.workspace)
        return doomed

    def _kill_now(self) -> None:
        """`_stop` without the event loop (a forced exit): the same kills, then `rm` in-process."""
        if self._proc is not None and self._proc.returncode is None:
            procs.kill_tree(self._proc.pid)
        self._free_host()
        for path in self._doomed():
            shutil.rmtree(path, ignore_errors=True)

    async def _alive(self) -> bool:
        return (
            self._proc is not None
            and self._proc.returncode is None
            and self._init_pid is not None
            and procs.alive(self._init_pid)
        )

    def limit_events(self) -> dict[str, int]:
        return self._cgroup.limit_events() if self._cgroup is not None else {}

    async def _died_from_inside(self) -> bool:
        """bwrap exits with its init's status when init dies inside (`kill -9 -1` reaches it:
        it is pid 2 of the namespace, under bwrap's own pid 1), and dies of the signal itself
        when killed from the host: a negative return code is the host's doing."""
        if self._proc is None:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._proc.wait(), 2)
        return self._proc.returncode is not None and self._proc.returncode >= 0

    # -- sessions ------------------------------------------------------------------------
    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        if self._init_pid is None or not await self._alive():
            raise SandboxDeadError("the local sandbox is not running")
        env = [f"{k}={v}" for k, v in sandbox_env(self.config).items()]
        prefix, preexec = launcher(self.config.limits, self._cgroup, own_session=True)
        return await procs.spawn(
            *prefix,
            "nsenter",
            "-t",
            str(self._init_pid),
            "-a",
            "-r",
            "-w",
            "--",
            "env",
            "-i",
            *env,
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=preexec,
            start_new_session=True,
        )

    def _shell_host_pid(self, session: ShellSession) -> int | None:
        if session.proc is None:
            return None
        cached = self._shell_pids.get(session.token)
        if cached and procs.alive(cached):
            return cached
        pid = procs.find_with_arg(session.proc.pid, session.token, "bash")
        if pid is not None:
            self._shell_pids[session.token] = pid
        return pid

    async def _signal_tree(self, session: ShellSession, sig: int) -> None:
        pid = self._shell_host_pid(session)
        if pid is not None:
            procs.signal_descendants(pid, sig)

    async def _signal_shell(self, session: ShellSession, sig: int) -> None:
        pid = self._shell_host_pid(session)
        if pid is not None:
            procs.signal_pids([pid], sig)

    async def _kill_shell(self, session: ShellSession) -> None:
        await self._signal_shell(session, signal.SIGKILL)
        self._shell_pids.pop(session.token, None)

    # -- files: direct on the host for the workspace, through the shell elsewhere ---------
    def _host_path(self, path: str, *, parent_only: bool = False) -> Path | None:
        """The host path of a workspace path, or None when it is outside the workspace.

        Symlinks are resolved on the host and must stay inside the workspace: a link made by
        the agent (`ln -s /etc/passwd x`) must never make the host read or write its target.
        """
        if self.workspace is None:
            return None
        p = self._abs(path)
        root = self.workdir.rstrip("/")
        if p != root and not p.startswith(root + "/"):
            return None
        host = self.workspace / p[len(root) :].lstrip("/")
        ws = os.path.realpath(self.workspace)
        # The workdir itself has no parent inside the workspace, and needs none: an upload
        # into it (a task's repository) is a host copy, not a tarball through the shell.
        probe = host.parent if parent_only and p != root else host
        real = os.path.realpath(probe)
        if real != ws and not real.startswith(ws + os.sep):
            return None
        if parent_only and host.is_symlink():
            return None
        return host

    async def read_file(self, path: str) -> bytes:
        host = self._host_path(path)
        if host is None:
            return await super().read_file(path)
        try:
            return await asyncio.to_thread(host.read_bytes)
        except FileNotFoundError:
            raise SandboxError(f"{path}: no such file in the sandbox") from None
        except IsADirectoryError:
            raise SandboxError(f"{path} is a directory, not a file") from None

    async def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        if path.startswith(self.tools_dir + "/") and self._ctl is not None:
            host: Path | None = self._ctl / "bin" / path[len(self.tools_dir) + 1 :]
        else:
            host = self._host_path(path, parent_only=True)
        if host is None:
            await super().write_file(path, data, mode)
            return
        raw = data.encode() if isinstance(data, str) else data

        def write() -> None:
            assert host is not None
            with atomic_path(host) as tmp:
                tmp.write_bytes(raw)
                if mode is not None:
                    tmp.chmod(mode)
                elif host.exists():
                    tmp.chmod(host.stat().st_mode & 0o7777)

        await asyncio.to_thread(write)

    async def upload(self, src: str | Path, dest: str) -> None:
        host = self._host_path(dest, parent_only=True)
        src = Path(src)
        if host is None or not src.exists():
            await super().upload(src, dest)
            return
        if src.is_dir():
            await _copy_tree(src, host)
        else:
            await self.write_file(dest, src.read_bytes(), mode=src.stat().st_mode & 0o777)

    async def download(self, src: str, dest: str | Path) -> None:
        host = self._host_path(src)
        if host is None or not host.exists():
            await super().download(src, dest)
            return
        dest = Path(dest)
        if host.is_dir():
            await asyncio.to_thread(shutil.copytree, host, dest, symlinks=True, dirs_exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(shutil.copyfile, host, dest)


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor`: start a real bubblewrap sandbox and run a command in it."""
    from uniagent.sandbox.base import probe

    name = "sandbox local (bubblewrap)"
    if shutil.which("bwrap") is None:
        return [(name, False, "bwrap not found on PATH: apt-get install bubblewrap")]
    sb = LocalSandbox(LocalConfig(start_retries=0, start_timeout_s=30))
    ok, detail = await probe(sb)
    if ok and sb._cgroup is not None and sb._cgroup.missing:
        detail += f"; no cgroup for {', '.join(sb._cgroup.missing)} (limits fall back to rlimits)"
    return [(name, ok, detail)]
