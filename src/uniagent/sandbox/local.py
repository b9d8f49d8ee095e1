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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import secrets
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from uniagent.errors import SandboxDeadError, SandboxError, SandboxStartError
from uniagent.sandbox import procs
from uniagent.sandbox.cgroups import SandboxCgroup, cgroup_name
from uniagent.sandbox.config import LocalConfig
from uniagent.sandbox.pipe import PipeShellSandbox
from uniagent.sandbox.procs import quote
from uniagent.sandbox.shell import ShellSession

log = logging.getLogger(__name__)

SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "var")
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
CONTROL_MOUNT = "/.uniagent"
SANDBOX_NICE = 19
"""Everything in a sandbox runs at this nice level (and its shell sessions' scheduler autogroups
too), so the controller (one event loop serving every episode) is not starved by the sandboxes'
own work: at 1,000 episodes on 2 cores, with dozens of test runs runnable, each session in an
autogroup of its own, the loop got a few percent of a core and lagged by seconds."""
INIT_ARGV = ("sh", "-c", "read -r _; exit 0", "uniagent-init")
"""What bwrap's init runs: it waits on a pipe whose only write end this process holds, and
exits at EOF, i.e. when this process closes it (stop) or dies. bwrap's init arms its
parent-death signal only after the whole sandbox is set up, so a bwrap killed in that window
(a start cancelled or timed out, the controller killed with -9) used to leave its init and a
`sleep infinity` running forever, reparented to the host's init. Now the command ends at
EOF, init has no child left and exits, and the PID namespace goes with it."""
_warned: set[str] = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(msg)


def _python_prefixes() -> list[str]:
    """uniagent's own interpreter and environment, so the sandbox's python can run pytest."""
    out: list[str] = []
    for p in {
        sys.prefix,
        sys.base_prefix,
        os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
    }:
        if p and os.path.isdir(p) and not any(p.startswith(f"/{d}/") for d in SYSTEM_DIRS):
            out.append(p)
    return sorted(out)


async def _remove_tree(path: Path) -> None:
    """`rm -rf` in a child process: shutil.rmtree is a Python loop over every file that holds
    the GIL (at 1,000 episodes the largest item in the worker threads' profile)."""
    try:
        proc = await procs.spawn(
            "rm", "-rf", "--", str(path), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL
        )
        await proc.wait()
    except OSError:
        pass
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
        proc = await procs.spawn(*argv, stdin=null, stdout=null, stderr=null)
        if await proc.wait() == 0:
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
        self._cgroup = SandboxCgroup(cgroup_name(self.id), lim.memory_mb, lim.pids, lim.cpus)
        if self._cgroup.missing:
            _warn_once(
                "cgroup",
                f"cgroups for {', '.join(self._cgroup.missing)} are not available here; memory falls back "
                "to RLIMIT_AS and the process limit is not enforced",
            )
        prefix, preexec = self._launcher()
        self._proc = await procs.spawn(
            *prefix,
            bwrap,
            *self._bwrap_args(),
            *INIT_ARGV,
            stdin=asyncio.subprocess.PIPE,  # the lifeline: see INIT_ARGV
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=preexec,
        )
        self._init_pid = await self._find_init()

    async def _find_init(self) -> int:
        """bwrap's child is init of the new PID namespace: the target sessions enter."""
        assert self._proc is not None
        for _ in range(500):
            if self._proc.returncode is not None:
                break
            kids = procs.children(self._proc.pid)
            if kids and procs.children(kids[0]):
                return kids[0]
            await asyncio.sleep(0.002)
        err = b""
        if self._proc.returncode is not None and self._proc.stderr:
            err = await self._proc.stderr.read()
        raise SandboxStartError(
            f"bubblewrap did not start: {err.decode(errors='replace').strip() or 'timeout'}"
        )

    def _bwrap_args(self) -> list[str]:
        cfg: LocalConfig = self.config
        base = Path(cfg.rootfs) if cfg.rootfs else Path("/")
        args = ["--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL"]
        if cfg.network:
            args.append("--share-net")
        args += ["--hostname", "sandbox", "--tmpfs", "/"]
        names = sorted(os.listdir(base)) if cfg.rootfs else list(SYSTEM_DIRS)
        for name in names:
            src = base / name
            if name in ("proc", "dev", "tmp", "sys") or not (src.exists() or src.is_symlink()):
                continue
            if src.is_symlink():
                args += ["--symlink", os.readlink(src), f"/{name}"]
            elif src.is_dir():
                args += ["--ro-bind", str(src), f"/{name}"]
        if not cfg.rootfs:
            for f in MASKED_FILES:
                if os.path.exists(f):
                    args += ["--ro-bind", "/dev/null", f]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/run"]
        # After the private /tmp: an environment living under /tmp must not be hidden by it.
        extra = list(cfg.ro_binds)
        if cfg.host_python:
            extra += _python_prefixes()
        for p in extra:
            if os.path.exists(p):
                args += ["--ro-bind", p, p]
        args += ["--bind", str(self.workspace), self.workdir, "--ro-bind", str(self._ctl), CONTROL_MOUNT]
        args += ["--remount-ro", "/", "--chdir", self.workdir, "--clearenv"]
        for key, value in self._env().items():
            args += ["--setenv", key, value]
        return args

    def _env(self) -> dict[str, str]:
        cfg: LocalConfig = self.config
        path = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        if cfg.host_python and not cfg.rootfs:
            path.insert(0, os.path.join(sys.prefix, "bin"))
        env = {"PATH": ":".join(path), "HOME": "/tmp", "TMPDIR": "/tmp", "TERM": "dumb", "LANG": "C.UTF-8"}
        env.update({k: os.environ[k] for k in cfg.env_allowlist if k in os.environ})
        env.update(cfg.env)
        return env

    def _launcher(self, own_session: bool = False) -> tuple[list[str], Callable[[], None] | None]:
        """What joins a new process to the sandbox's cgroups and sets its rlimits before it runs.

        An argv prefix (`sh` writes its pid into each cgroup.procs, `prlimit` sets the limits,
        each then execs the next), not a preexec_fn: a preexec_fn makes Python fork() its whole
        address space instead of vfork(), ~10 ms at 50 MB RSS and ~100 ms at 1 GB of kernel
        time with the event loop blocked until the child execs; at 1,000 episodes that fork
        churn was most of the run's CPU. Without `prlimit` (util-linux, like nsenter) the
        rlimits fall back to the preexec_fn. `nice` lowers what runs inside (SANDBOX_NICE);
        a process started in its own session (`own_session`) is also the first of a new
        scheduler autogroup, whose nice is set as well: where the kernel groups by session,
        the nice of a process counts only inside its group.
        """
        lim = self.config.limits
        prefix: list[str] = []
        files = self._cgroup.procs_files if self._cgroup else []
        steps = [f"{{ echo $$ > {quote(f)}; }} 2>/dev/null" for f in files]
        if own_session:  # never without: it would lower the controller's own group
            steps.append(f"{{ echo {SANDBOX_NICE} > /proc/self/autogroup; }} 2>/dev/null")
        if steps:
            prefix += ["/bin/sh", "-c", f'{"; ".join(steps)}; exec "$@"', "uniagent-join"]
        nice = shutil.which("nice")
        if nice is not None:
            prefix += [nice, "-n", str(SANDBOX_NICE)]
        flags: list[str] = []
        if lim.open_files:
            flags.append(f"--nofile={lim.open_files}")
        if lim.file_size_mb:
            flags.append(f"--fsize={lim.file_size_mb << 20}")
        if lim.cpu_time_s:
            flags.append(f"--cpu={lim.cpu_time_s}")
        if lim.memory_mb and self._cgroup and "memory" in self._cgroup.missing:
            flags.append(f"--as={lim.memory_mb << 20}")
        prlimit = shutil.which("prlimit")
        if not flags:
            return prefix, None
        if prlimit is not None:
            return [*prefix, prlimit, *flags, "--"], None
        return prefix, self._child_setup(with_cgroups=False)

    def _child_setup(self, with_cgroups: bool = True) -> Callable[[], None]:
        """Runs in the forked child before exec: join the cgroups, set the rlimits (the
        fallback of `_launcher` where `prlimit` is missing).

        Only raw syscalls here (no logging, no locks): the parent may have other threads.
        """
        lim = self.config.limits
        files = self._cgroup.procs_files if self._cgroup and with_cgroups else []
        rl: list[tuple[int, int]] = []
        if lim.open_files:
            rl.append((resource.RLIMIT_NOFILE, lim.open_files))
        if lim.file_size_mb:
            rl.append((resource.RLIMIT_FSIZE, lim.file_size_mb << 20))
        if lim.cpu_time_s:
            rl.append((resource.RLIMIT_CPU, lim.cpu_time_s))
        if lim.memory_mb and self._cgroup and "memory" in self._cgroup.missing:
            rl.append((resource.RLIMIT_AS, lim.memory_mb << 20))

        def setup() -> None:
            pid = str(os.getpid()).encode()
            for f in files:
                try:
                    fd = os.open(f, os.O_WRONLY)
                    os.write(fd, pid)
                    os.close(fd)
                except OSError:
                    pass
            for which, value in rl:
                with contextlib.suppress(OSError, ValueError):
                    resource.setrlimit(which, (value, value))

        return setup

    async def _stop(self) -> None:
        if self._proc is not None:
            # The tree, not just bwrap: a bwrap killed mid-start leaves its init behind.
            await procs.kill_process_tree(self._proc, 10)
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.kill_all)
            await asyncio.to_thread(self._cgroup.remove)
        if self._ctl is not None:
            await _remove_tree(self._ctl)
        if self._own_workspace and self.workspace is not None and not self.config.keep_workspace:
            await _remove_tree(self.workspace)

    async def _alive(self) -> bool:
        return (
            self._proc is not None
            and self._proc.returncode is None
            and self._init_pid is not None
            and procs.alive(self._init_pid)
        )

    # -- sessions ------------------------------------------------------------------------
    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        if self._init_pid is None or not await self._alive():
            raise SandboxDeadError("the local sandbox is not running")
        env = [f"{k}={v}" for k, v in self._env().items()]
        prefix, preexec = self._launcher(own_session=True)
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
            host.parent.mkdir(parents=True, exist_ok=True)
            tmp = host.with_name(f".{host.name}.ua-{secrets.token_hex(4)}")
            tmp.write_bytes(raw)
            if mode is not None:
                tmp.chmod(mode)
            elif host.exists():
                tmp.chmod(host.stat().st_mode & 0o7777)
            os.replace(tmp, host)

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
