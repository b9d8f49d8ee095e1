"""How the local sandbox's processes are launched: bubblewrap's command line and environment,
and the launcher that puts each new process into the sandbox's cgroups, rlimits and nice level.

Pure construction from the LocalConfig (defined here, the settings of what bubblewrap builds; the
backend module, sandbox/local.py, takes it from here) and the sandbox's paths (no processes started
here): the lifecycle, sessions and files are LocalSandbox's.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import Field

from uniagent.sandbox.cgroups import SandboxCgroup
from uniagent.sandbox.procs import quote
from uniagent.sandbox.settings import Limits, SandboxConfig


class LocalConfig(SandboxConfig):
    """bubblewrap: host system read-only, a private writable workspace, no network by default."""

    type: Literal["local"] = "local"
    rootfs: Path | None = Field(None, description="a root filesystem directory to use instead of the host's")
    workspace: Path | None = Field(
        None, description="host directory bound at `workdir`; a fresh temp dir when unset"
    )
    keep_workspace: bool = Field(False, description="keep a temp workspace after stop (debugging)")
    network: bool = False
    host_python: bool = Field(
        True, description="expose uniagent's Python environment read-only and put it first on PATH"
    )
    ro_binds: list[str] = Field(
        default_factory=list, description="extra host paths bound read-only at the same path"
    )
    tmpfs: list[str] = Field(
        default_factory=list,
        description="absolute paths given private writable directories (a Harbor task's /tests, /logs)",
    )
    env_allowlist: list[str] = Field(
        default_factory=lambda: ["LANG", "LC_ALL", "TZ"],
        description="host variables passed through; everything else is scrubbed",
    )


SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "var")
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
CONTROL_MOUNT = "/.uniagent"
SANDBOX_NICE = 19
"""Everything in a sandbox runs at this nice level (and its shell sessions' scheduler autogroups
too), so the controller (one event loop serving every episode) is not starved by the sandboxes'
own work: at 1,000 episodes on 2 cores, with dozens of test runs runnable, each session in an
autogroup of its own, the loop got a few percent of a core and lagged by seconds."""
INIT_READY = b"uniagent-sandbox-ready"
INIT_ARGV = ("sh", "-c", f"echo {INIT_READY.decode()}; read -r _; exit 0", "uniagent-init")
"""What bwrap's init runs: it says it is ready on its stdout (the sandbox is built: the start
waits for that line instead of polling /proc), then waits on a pipe whose only write end this
process holds, and exits at EOF, i.e. when this process closes it (stop) or dies. bwrap's
init arms its parent-death signal only after the whole sandbox is set up, so a bwrap killed in
that window (a start cancelled or timed out, the controller killed with -9) used to leave its
init and a `sleep infinity` running forever, reparented to the host's init. Now the command
ends at EOF, init has no child left and exits, and the PID namespace goes with it."""


def python_prefixes() -> list[str]:
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


def sandbox_env(cfg: LocalConfig) -> dict[str, str]:
    """The whole environment inside (bwrap clears the rest): defaults, allowlisted host
    variables, then the config's own."""
    path = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    if cfg.host_python and not cfg.rootfs:
        path.insert(0, os.path.join(sys.prefix, "bin"))
    env = {"PATH": ":".join(path), "HOME": "/tmp", "TMPDIR": "/tmp", "TERM": "dumb", "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in cfg.env_allowlist if k in os.environ})
    env.update(cfg.env)
    return env


def bwrap_args(cfg: LocalConfig, workspace: Path, ctl: Path, workdir: str) -> list[str]:
    """bubblewrap's options (without the command): the layout of the local module docstring,
    `workspace` bound read-write at `workdir`, the control dir `ctl` read-only at CONTROL_MOUNT."""
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
    for path in cfg.tmpfs:
        args += ["--tmpfs", path]
    # After the private /tmp: an environment living under /tmp must not be hidden by it.
    extra = list(cfg.ro_binds)
    if cfg.host_python:
        extra += python_prefixes()
    for p in extra:
        if os.path.exists(p):
            args += ["--ro-bind", p, p]
    args += ["--bind", str(workspace), workdir, "--ro-bind", str(ctl), CONTROL_MOUNT]
    args += ["--remount-ro", "/", "--chdir", workdir, "--clearenv"]
    for key, value in sandbox_env(cfg).items():
        args += ["--setenv", key, value]
    return args


def launcher(
    lim: Limits, cgroup: SandboxCgroup | None, own_session: bool = False
) -> tuple[list[str], Callable[[], None] | None]:
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
    prefix: list[str] = []
    files = cgroup.procs_files if cgroup else []
    steps = [f"{{ echo $$ > {quote(f)}; }} 2>/dev/null" for f in files]
    if own_session:  # never without: it would lower the controller's own group
        steps.append(f"{{ echo {SANDBOX_NICE} > /proc/self/autogroup; }} 2>/dev/null")
    if steps:
        prefix += ["/bin/sh", "-c", f'{"; ".join(steps)}; exec "$@"', "uniagent-join"]
    nice = shutil.which("nice")
    if nice is not None:
        prefix += [nice, "-n", str(SANDBOX_NICE)]
    no_memcg = bool(cgroup and "memory" in cgroup.missing)
    flags = [f"--{name}={value}" for name, value in lim.rlimits(address_space=no_memcg).items()]
    prlimit = shutil.which("prlimit")
    if not flags:
        return prefix, None
    if prlimit is not None:
        return [*prefix, prlimit, *flags, "--"], None
    return prefix, child_setup(lim, cgroup, with_cgroups=False)


def child_setup(lim: Limits, cgroup: SandboxCgroup | None, with_cgroups: bool = True) -> Callable[[], None]:
    """Runs in the forked child before exec: join the cgroups, set the rlimits (the
    fallback of `launcher` where `prlimit` is missing).

    Only raw syscalls here (no logging, no locks): the parent may have other threads.
    """
    files = cgroup.procs_files if cgroup and with_cgroups else []
    no_memcg = bool(cgroup and "memory" in cgroup.missing)
    rl = [
        (getattr(resource, f"RLIMIT_{name.upper()}"), value)
        for name, value in lim.rlimits(address_space=no_memcg).items()
    ]

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
