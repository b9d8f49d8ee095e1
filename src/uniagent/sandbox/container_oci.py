"""docker and podman containers (OCI runtimes), driven through their CLIs.

- The image is resolved before the timed start (a pull can take longer than
  `start_timeout_s`); a failed pull with no local copy is a `SandboxStartError` that
  carries the CLI's message.
- PID 1 is a small `sh` loop rather than the image's entrypoint: it keeps the container
  up, exits on SIGTERM, and, blocked in `wait`, reaps orphans that exec sessions leave
  behind, so no `--init` binary (tini, catatonit) has to exist on the host. With a
  wall-clock limit it also exits by itself shortly after the limit, and `--rm` then
  removes the container, so a crashed controller cannot leak it forever.
- Containers carry labels (`uniagent.sandbox`, `uniagent.owner=<host>:<pid>`), so
  `reap_leaked()` can find and remove those whose owner died.
- Big files and all directories travel as `<cli> cp` tar streams (no base64, nothing
  needed in the image); small files through the shell, where a round trip is cheaper than
  starting a CLI process.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import resource
import socket
import tarfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

from uniagent.errors import SandboxDeadError, SandboxError, SandboxStartError
from uniagent.sandbox.container_base import CliResult, ContainerSandbox, run_cli
from uniagent.sandbox.container_tar import tar_dir, untar_to
from uniagent.sandbox.procs import quote, spawn

log = logging.getLogger(__name__)

_Feeder = Callable[[IO[bytes]], None]
_Drainer = Callable[[IO[bytes]], None]

LABEL = "uniagent.sandbox"
OWNER_LABEL = "uniagent.owner"


# Small files travel through the already-open shell session; big ones through one `cp`
# process, which costs 60-150 ms whatever the size. Measured with docker 20.10 and podman
# 4.3 on 2 cores: writing through the shell costs ~300 ms per MiB (base64 chunks that bash
# must parse), so `cp` wins from one chunk (256 KiB) up; reading through the shell is one
# `base64` command (~25 ms per MiB plus a size probe), so `cp` wins only from a few MiB.
WRITE_CP_THRESHOLD = 1 << 18
READ_CP_THRESHOLD = 4 << 20

FILE_TIMEOUT_S = 600.0
_GONE_MARKERS = ("no such container", "no container with name or id", "no such object")

# One pull per image at a time (per event loop): N sandboxes starting together on a cold
# machine should not start N downloads of the same image.
_PULL_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _nproc_ceiling() -> int:
    """An RLIMIT_NPROC podman can always set. podman (4.3, as root) was seen running with
    its own limit lowered to pid_max, and a container cannot get more than podman has
    without CAP_SYS_RESOURCE; more processes than pid_max cannot exist anyway. The real
    process budget is the pids cgroup (`limits.pids`)."""
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    hard = _hard_limit(resource.RLIMIT_NPROC)
    return min(pid_max, hard) if hard is not None else pid_max


def _hard_limit(which: int) -> int | None:
    """This process's hard rlimit, or None when unlimited."""
    hard = resource.getrlimit(which)[1]
    return None if hard == resource.RLIM_INFINITY else hard


class OciSandbox(ContainerSandbox):
    """A docker or podman container (built by `ContainerSandbox(config)`)."""

    runtimes = ("docker", "podman")

    def _exec_argv(self, argv: list[str]) -> list[str]:
        return [self.cli, "exec", "-i", self.name, *argv]

    async def _alive(self) -> bool:
        try:
            res = await self._cli("inspect", "-f", "{{.State.Running}}", self.name, timeout=30)
        except SandboxError:
            return False
        return res.ok and res.out.strip() == b"true"

    async def _prepare_image(self) -> None:
        cfg = self.config
        present = (await self._cli("image", "inspect", cfg.image)).ok
        if present and (cfg.pull != "always" or cfg.build):
            return
        if cfg.build:
            await self._build_image()
            return
        if cfg.pull == "never":
            raise SandboxStartError(
                f"image {cfg.image!r} is not available to {self.runtime} and pull is 'never'; "
                f"build or pull it first (`{self.runtime} pull {cfg.image}`) or set pull: missing"
            )
        loop = asyncio.get_running_loop()
        locks = _PULL_LOCKS.setdefault(loop, {})
        async with locks.setdefault((self.cli, cfg.image), asyncio.Lock()):
            if cfg.pull == "missing" and (await self._cli("image", "inspect", cfg.image)).ok:
                return  # another sandbox pulled it while we waited
            res = CliResult(1, b"", "")
            for attempt in range(cfg.start_retries + 1):
                res = await self._cli("pull", cfg.image, timeout=None)
                if res.ok:
                    return
                log.warning(
                    "%s pull %s failed (attempt %d): %s", self.runtime, cfg.image, attempt + 1, res.message()
                )
                if attempt < cfg.start_retries:
                    await asyncio.sleep(min(1.0 * 2**attempt, 10))
        raise SandboxStartError(f"`{self.runtime} pull {cfg.image}` failed: {res.message()}")

    async def _build_image(self) -> None:
        """`image` built from the `build` directory's Dockerfile, once per image at a time (the
        pull locks); its base image is pulled only if missing and `pull` allows it."""
        cfg = self.config
        assert cfg.build and cfg.image
        locks = _PULL_LOCKS.setdefault(asyncio.get_running_loop(), {})
        async with locks.setdefault((self.cli, cfg.image), asyncio.Lock()):
            if (await self._cli("image", "inspect", cfg.image)).ok:
                return  # another sandbox built it while we waited
            pull = (
                []
                if self.runtime == "docker"
                else ["--pull=never" if cfg.pull == "never" else "--pull=missing"]
            )
            res = await self._cli("build", *pull, "-t", cfg.image, cfg.build, timeout=cfg.build_timeout_s)
        if not res.ok:
            raise SandboxStartError(
                f"`{self.runtime} build -t {cfg.image} {cfg.build}` failed: {res.message()}"
            )

    def _keeper(self) -> list[str]:
        """PID 1: sleeps in `wait` (which reaps orphans), exits on TERM/INT/HUP, and, with a
        wall-clock limit, by itself a little after it."""
        trap = "trap 'exit 0' TERM INT HUP; "
        wall = self.config.limits.wall_clock_s
        if wall:
            return ["-c", trap + f"sleep {int(wall) + 30} & wait $!; exit 0"]
        return ["-c", trap + "while :; do sleep 3600 & wait $!; done"]

    def _run_args(self) -> list[str]:
        cfg, lim = self.config, self.config.limits
        args = [
            "run", "-d", "--rm", "--name", self.name,
            "--label", f"{LABEL}=1", "--label", f"{OWNER_LABEL}={_owner()}",
            "--label", f"uniagent.started={int(time.time())}",
        ]  # fmt: skip
        if not cfg.network:
            args += ["--network", "none"]
        args += lim.cgroup_flags(no_swap=True)
        rlimits = lim.rlimits()
        nofile = rlimits.pop("nofile", None)
        for name, value in rlimits.items():
            args += ["--ulimit", f"{name}={value}:{value}"]
        if self.runtime == "podman":
            # podman's defaults raise nofile and nproc to about a million; without
            # CAP_SYS_RESOURCE (nested containers, CI runners) runc then fails with EPERM.
            # Values no higher than the limits podman itself runs with always work (there
            # is no daemon: the container inherits them from us).
            host_nofile = _hard_limit(resource.RLIMIT_NOFILE)
            if host_nofile is not None and (nofile is None or nofile > host_nofile):
                if nofile is not None:
                    log.warning("open_files=%d exceeds this host's hard limit; using %d", nofile, host_nofile)
                nofile = host_nofile
            if not any(a.startswith("nproc=") for a in cfg.run_args):
                nproc = _nproc_ceiling()
                args += ["--ulimit", f"nproc={nproc}:{nproc}"]
        if nofile:
            args += ["--ulimit", f"nofile={nofile}:{nofile}"]
        for key, value in cfg.env.items():
            args += ["-e", f"{key}={value}"]
        args += list(cfg.run_args)
        args += ["--entrypoint", "sh", cfg.image, *self._keeper()]
        return args

    async def _launch(self) -> None:
        res = await self._cli(*self._run_args(), timeout=None)  # bounded by start_timeout_s
        if not res.ok:
            raise SandboxStartError(f"`{self.runtime} run {self.config.image}` failed: {res.message()}")
        mk = await self._cli("exec", self.name, "mkdir", "-p", "--", self.workdir)
        if not mk.ok:
            raise SandboxStartError(f"could not create {self.workdir} in {self._what()}: {mk.message()}")

    async def _stop(self) -> None:
        args = ["rm", "-f", "-v"]
        if self.runtime == "podman":
            args += ["-t", "0"]  # podman's rm -f waits for the stop timeout otherwise
        res = await self._cli(*args, self.name)
        if not res.ok and not any(m in res.message().lower() for m in _GONE_MARKERS):
            if "removal of container" in res.message() and "already in progress" in res.message():
                return  # --rm got there first
            raise SandboxError(f"could not remove {self._what()}: {res.message()}")

    async def _cp_failed(self, res: CliResult, what: str) -> SandboxError:
        """The error for a failed `cp`: dead if the container is gone, else the CLI's message."""
        if not await self._alive():
            return SandboxDeadError(f"{what} failed: the {self._what()} is not running ({res.message()})")
        return SandboxError(f"{what} failed: {res.message()}")

    # -- files (docker / podman: `cp` tar streams for big payloads) -----------------------
    async def read_file(self, path: str) -> bytes:
        self._check_running()
        src = self._abs(path)
        size = await self._size_of(src)
        if size is not None and size < READ_CP_THRESHOLD:
            return await super().read_file(path)
        args = ["cp", *(["-L"] if self.runtime == "docker" else []), f"{self.name}:{src}", "-"]
        res = await self._cli(*args, timeout=FILE_TIMEOUT_S)
        if not res.ok:
            raise await self._cp_failed(res, f"reading {path}")
        with tarfile.open(fileobj=io.BytesIO(res.out), mode="r:") as tar:
            member = tar.next()
            if member is None or not member.isfile():
                kind = "a directory" if member is not None and member.isdir() else "not a regular file"
                raise SandboxError(f"reading {path} failed: it is {kind}")
            f = tar.extractfile(member)
            assert f is not None
            return f.read()

    async def _size_of(self, path: str) -> int | None:
        """Size of a regular file (following links), or None when it is not one (the caller
        then takes the `cp` path, whose error names the problem)."""
        res = await self.exec(
            f"[ -f {quote(path)} ] && wc -c < {quote(path)}", timeout=60, max_output=None, session="_files"
        )
        try:
            return int(res.output.strip()) if res.ok else None
        except ValueError:
            return None

    async def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        raw = data.encode() if isinstance(data, str) else data
        if len(raw) < WRITE_CP_THRESHOLD:
            await super().write_file(path, raw, mode)
            return
        self._check_running()
        dest = PurePosixPath(self._abs(path))
        await self._checked(f"mkdir -p -- {quote(str(dest.parent))}", f"writing {path}")
        bio = io.BytesIO()
        with tarfile.open(fileobj=bio, mode="w") as tar:
            info = tarfile.TarInfo(dest.name)
            info.size, info.mode, info.mtime = len(raw), 0o644 if mode is None else mode, int(time.time())
            tar.addfile(info, io.BytesIO(raw))
        res = await self._cli(
            "cp", "-", f"{self.name}:{dest.parent}", stdin=bio.getvalue(), timeout=FILE_TIMEOUT_S
        )
        if not res.ok:
            raise await self._cp_failed(res, f"writing {path}")

    async def upload(self, src: str | Path, dest: str) -> None:
        """Copy a host file or directory to `dest`; a directory streams as one tar."""
        src = Path(src)
        if not src.is_dir():
            await super().upload(src, dest)
            return
        self._check_running()
        target = self._abs(dest)
        await self._checked(f"mkdir -p -- {quote(target)}", f"uploading to {dest}")
        res = await self._stream_cli(["cp", "-", f"{self.name}:{target}"], feed=lambda f: tar_dir(src, f))
        if not res.ok:
            raise await self._cp_failed(res, f"uploading {src} to {dest}")

    async def download(self, src: str, dest: str | Path) -> None:
        """Copy a file or directory out of the container to the host path `dest`."""
        self._check_running()
        dest = Path(dest)
        args = ["cp", *(["-L"] if self.runtime == "docker" else []), f"{self.name}:{self._abs(src)}", "-"]
        res = await self._stream_cli(args, drain=lambda f: untar_to(f, dest))
        if not res.ok:
            raise await self._cp_failed(res, f"downloading {src}")

    async def _stream_cli(
        self,
        args: list[str],
        *,
        feed: _Feeder | None = None,
        drain: _Drainer | None = None,
    ) -> CliResult:
        """Run the CLI with a tar stream written to its stdin (`feed`) or read from its
        stdout (`drain`) by a thread, so neither the loop nor memory holds the archive."""
        r, w = os.pipe()
        try:
            proc = await spawn(
                self.cli,
                *args,
                stdin=r if feed else asyncio.subprocess.DEVNULL,
                stdout=w if drain else asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except BaseException:
            os.close(r)
            os.close(w)
            raise
        # The child holds its own copies; ours must close so EOF reaches the other side.
        os.close(r if feed else w)
        ours = w if feed else r
        box: dict[str, BaseException] = {}

        def work() -> None:
            try:
                with os.fdopen(ours, "wb" if feed else "rb") as f:
                    if feed:
                        feed(f)
                    elif drain:
                        drain(f)
            except BaseException as exc:  # reported after the CLI's own error
                box["exc"] = exc

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        try:
            assert proc.stderr is not None
            err = await asyncio.wait_for(proc.stderr.read(), FILE_TIMEOUT_S)
            await asyncio.wait_for(proc.wait(), FILE_TIMEOUT_S)
            await asyncio.to_thread(thread.join, FILE_TIMEOUT_S)
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        res = CliResult(proc.returncode or 0, b"", err.decode(errors="replace"))
        exc = box.get("exc")
        if res.ok and exc is not None:
            if isinstance(exc, BrokenPipeError):
                raise SandboxError(f"`{self.runtime} {args[0]}` stopped reading its input") from exc
            if isinstance(exc, (tarfile.TarError, OSError)):
                raise SandboxError(f"`{self.runtime} {args[0]}` archive problem: {exc}") from exc
            raise exc
        return res


async def reap_leaked(
    runtime: str = "docker", executable: str | None = None, *, dry_run: bool = False
) -> list[str]:
    """Remove uniagent containers on this host whose owning process no longer runs (after a
    crash or a SIGKILL). Returns their ids. Containers owned by live processes or by other
    hosts are left alone."""
    cli = executable or runtime
    res = await run_cli([cli, "ps", "-a", "-q", "--no-trunc", "--filter", f"label={LABEL}"])
    if not res.ok:
        raise SandboxError(f"`{runtime} ps` failed: {res.message()}")
    ids = res.out.decode().split()
    if not ids:
        return []
    fmt = '{{.Id}} {{index .Config.Labels "' + OWNER_LABEL + '"}}'
    res = await run_cli([cli, "inspect", "-f", fmt, *ids])
    host = socket.gethostname()
    leaked = []
    for line in res.out.decode().splitlines():
        cid, _, owner = line.partition(" ")
        owner_host, _, pid = owner.rpartition(":")
        if owner_host != host or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            leaked.append(cid)
        except PermissionError:
            continue  # alive, someone else's
    if leaked and not dry_run:
        rm = ["rm", "-f", "-v", *(["-t", "0"] if runtime == "podman" else [])]
        await run_cli([cli, *rm, *leaked])
    return leaked
