"""The Sandbox contract and what every backend shares.

A backend implements `_start`, `_stop` and `_open_session` (a persistent shell of its own
kind: see `Session`); it gets `exec`, named sessions, binary-safe file transfer through the
shell, retries, a wall-clock watchdog and bounded start concurrency from here. Backends that
run bash over pipes derive from `PipeShellSandbox` (sandbox/pipe.py), which supplies the
session; others (SWE-ReX) bring their own. Backends with a faster native path for files (a
bind-mounted workspace, `docker cp`, an SDK call) override the file methods.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import io
import logging
import secrets
import tarfile
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self

from uniagent.errors import SandboxDeadError, SandboxError, SandboxStartError
from uniagent.sandbox.procs import quote
from uniagent.sandbox.shell import ExecResult, wrap_cwd_env

log = logging.getLogger(__name__)

# Bytes per shell command when files travel through the shell (base64 inflates by 4/3).
_CHUNK = 1 << 18

EXEC_TIMEOUT_S = 120.0
"""`exec` without a timeout (code driving a sandbox). A model's commands are bounded by
`agent.command_timeout_s`, which its tools pass explicitly."""

_starting: contextvars.ContextVar[bool] = contextvars.ContextVar("uniagent_sandbox_starting", default=False)
"""True inside a start that holds a start slot: a sandbox started as part of it (a SWE-ReX
server's inner sandbox) runs in that slot instead of waiting for a second one, which with one
slot would never come."""


class StartSlots:
    """At most `n` sandbox starts at once, over every backend.

    An asyncio.Semaphore binds to the event loop it first waits on, so one semaphore is kept per
    running loop: a process that runs several loops (tests, a trainer's worker threads) gets the
    same bound in each instead of a "bound to a different event loop" error.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._sems: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def _sem(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._sems.get(loop)
        if sem is None:
            sem = self._sems[loop] = asyncio.Semaphore(self.n)
        return sem

    async def run(self, start: Callable[[], Awaitable[None]]) -> None:
        """Await `start()` in a slot, or in the caller's slot when this start is nested in one."""
        if _starting.get():
            await start()
            return
        async with self._sem():
            token = _starting.set(True)
            try:
                await start()
            finally:
                _starting.reset(token)


class Session(Protocol):
    """A persistent shell in a sandbox: cwd and variables survive between commands; commands
    run one at a time. `ShellSession` (bash over pipes) and SWE-ReX's sessions are two."""

    name: str

    def alive(self) -> bool: ...

    async def run(self, command: str, timeout: float, max_output: int | None) -> ExecResult: ...

    async def interrupt(self) -> None: ...

    async def close(self) -> None: ...


class Sandbox(ABC):
    """Where an episode's commands run. Unstarted when built; `async with` starts and stops it."""

    kind: ClassVar[str] = "?"
    start_slots: ClassVar[StartSlots | None] = None
    """Bounds concurrent starts over all backends (set with `set_start_concurrency`)."""
    _live: ClassVar[weakref.WeakSet[Sandbox]] = weakref.WeakSet()
    """Sandboxes started (or starting) and not yet stopped: what `kill_all_now` tears down."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.workdir: str = config.workdir
        self.tools_dir: str = "/opt/uniagent/bin"
        self._sessions: dict[str, Session] = {}
        self._session_lock = asyncio.Lock()
        self._started = False
        self._stopped = False
        self._watchdog: asyncio.Task[None] | None = None
        self.start_time_s: float | None = None

    # -- backend hooks -------------------------------------------------------------------
    @abstractmethod
    async def _start(self) -> None: ...

    @abstractmethod
    async def _stop(self) -> None: ...

    @abstractmethod
    async def _open_session(self, name: str) -> Session:
        """A new, started persistent shell named `name` (see `session`)."""

    async def _close_sessions(self) -> None:
        """Close every session before the backend stops (each backend's own way)."""
        for s in list(self._sessions.values()):
            await s.close()
        self._sessions.clear()

    def _preamble(self) -> str:
        """Shell lines run when a session starts: PATH, env, cwd."""
        lines = [f'export PATH={quote(self.tools_dir)}:"$PATH"']
        lines += [f"export {k}={quote(v)}" for k, v in self.config.env.items()]
        lines.append(f"cd -- {quote(self.workdir)} 2>/dev/null || true")
        return "\n".join(lines)

    async def _alive(self) -> bool:
        return True

    def limit_events(self) -> dict[str, int]:
        """Times this sandbox's own limits were hit (`oom_kill`, `pids_max`); {} where the backend
        cannot tell. Read before `stop` (the counters go with the sandbox)."""
        return {}

    async def _died_from_inside(self) -> bool:
        """Whether the sandbox, now dead, ended because of what ran in it (its processes killed
        from inside) rather than from outside (the backend killed, the host). False where the
        backend cannot tell: a death nobody can attribute stays an infrastructure failure."""
        return False

    async def breakage(self) -> str | None:
        """Why this sandbox is broken, when what ran inside it (the agent's commands) broke it:
        its own limits exhausted, or its processes killed from inside. None when there is no such
        evidence, or when we stopped it ourselves (a wall-clock limit, a cancelled run)."""
        if self._stopped:
            return None
        hits = self.limit_events()
        if hits.get("oom_kill"):
            return f"its memory limit was exhausted ({hits['oom_kill']} process(es) OOM-killed)"
        if hits.get("pids_max"):
            return f"its process limit was exhausted ({hits['pids_max']} fork(s) refused)"
        if self._started and not await self._alive() and await self._died_from_inside():
            return "its processes were killed from inside (the sandbox's init was killed)"
        return None

    def _kill_now(self) -> None:  # noqa: B027 (a hook with a default, not abstract)
        """Kill what this sandbox runs and free what it holds on this host, synchronously (no
        event loop: a process on its way out, see `kill_all_now`). Best effort. The default does
        nothing: backends whose sandboxes live elsewhere are not this host's to sweep."""

    @classmethod
    def kill_all_now(cls) -> int:
        """`_kill_now` every live sandbox of this process: a forced exit (a second SIGTERM or
        Ctrl-C while stopping, runner/interrupt.py) that cannot wait for their async stops.
        Returns how many were torn down."""
        n = 0
        for sb in list(Sandbox._live):
            try:
                sb._kill_now()
                n += 1
            except Exception as exc:  # the next one is still torn down
                log.warning("%s sandbox: forced teardown failed: %s", sb.kind, exc)
        Sandbox._live.clear()
        return n

    # -- lifecycle -----------------------------------------------------------------------
    @classmethod
    def set_start_concurrency(cls, n: int | None) -> None:
        """At most `n` starts at once (`None`: unbounded); nested starts share their outer slot."""
        Sandbox.start_slots = StartSlots(n) if n else None

    async def start(self) -> None:
        if self._started:
            return
        Sandbox._live.add(self)
        cfg = self.config
        last: BaseException | None = None
        began = time.perf_counter()
        for attempt in range(cfg.start_retries + 1):
            try:
                if self.start_slots is not None:
                    await self.start_slots.run(self._start_with_timeout)
                else:
                    await self._start_with_timeout()
                self._started = True
                self.start_time_s = time.perf_counter() - began
                self._arm_watchdog()
                return
            except (SandboxError, OSError, TimeoutError) as exc:
                last = exc
                log.warning("%s sandbox start attempt %d failed: %s", self.kind, attempt + 1, exc)
                await self._safe_stop()
                if attempt < cfg.start_retries:
                    await asyncio.sleep(min(0.5 * 2**attempt, 5))
            except BaseException:
                # Cancelled (Ctrl-C, a runner stopping early) or an unexpected error: what this
                # attempt started is freed before the exception goes on, or it would leak.
                await asyncio.shield(self._safe_stop())
                Sandbox._live.discard(self)
                raise
        Sandbox._live.discard(self)
        raise SandboxStartError(
            f"could not start the {self.kind} sandbox after {cfg.start_retries + 1} attempts: {last}"
        ) from last

    async def _start_with_timeout(self) -> None:
        await asyncio.wait_for(self._start_and_probe(), self.config.start_timeout_s)

    async def _start_and_probe(self) -> None:
        await self._start()
        await self.session("default")

    def _arm_watchdog(self) -> None:
        wall = self.config.limits.wall_clock_s
        if wall:
            self._watchdog = asyncio.get_running_loop().create_task(self._expire(wall))

    async def _expire(self, after: float) -> None:
        await asyncio.sleep(after)
        log.warning("%s sandbox reached its wall-clock limit of %gs; stopping it", self.kind, after)
        await self.stop()

    async def _safe_stop(self) -> None:
        await self._close_sessions()
        try:
            await self._stop()
        except Exception as exc:  # a failed cleanup must not hide the start error
            log.warning("%s sandbox cleanup failed: %s", self.kind, exc)

    async def stop(self) -> None:
        """Kill everything that runs inside and free all resources. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._watchdog and self._watchdog is not asyncio.current_task():
            self._watchdog.cancel()
        try:
            await self._safe_stop()
        finally:
            Sandbox._live.discard(self)

    async def alive(self) -> bool:
        if not self._started or self._stopped:
            return False
        return await self._alive()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- commands ------------------------------------------------------------------------
    async def session(self, name: str = "default") -> Session:
        """A persistent shell; created on first use. Sessions do not share cwd or variables."""
        if self._stopped:
            raise SandboxDeadError(f"the {self.kind} sandbox is stopped")
        sess = self._sessions.get(name)
        if sess is None:
            async with self._session_lock:  # two first uses at once must not start two shells
                sess = self._sessions.get(name)
                if sess is None:
                    sess = await self._open_session(name)
                    self._sessions[name] = sess
        return sess

    async def exec(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        session: str = "default",
        max_output: int | None = -1,
    ) -> ExecResult:
        """Run a bash command line in a persistent session.

        With `cwd` or `env` the command runs in a subshell, so the session's own state is
        untouched. `max_output=-1` uses the config's limit; `None` keeps everything.
        """
        if not self._started or self._stopped:
            raise SandboxDeadError(f"the {self.kind} sandbox is not running (start it first)")
        sess = await self.session(session)
        limit = self.config.max_output_chars if max_output == -1 else max_output
        t = EXEC_TIMEOUT_S if timeout is None else timeout
        try:
            result = await sess.run(wrap_cwd_env(command, cwd, env), t, limit)
        except SandboxDeadError:
            if not await self._alive():
                raise SandboxDeadError(f"the {self.kind} sandbox died") from None
            raise
        if not sess.alive() and not await self._alive():
            # The shell ended because the whole sandbox went away, not because of `exit`.
            raise SandboxDeadError(f"the {self.kind} sandbox died while running a command")
        return result

    async def _checked(self, command: str, what: str, timeout: float = 300) -> str:
        res = await self.exec(command, timeout=timeout, max_output=None, session="_files")
        if not res.ok:
            raise SandboxError(f"{what} failed (exit {res.exit_code}): {res.output.strip()[-500:]}")
        return res.output

    # -- files (through the shell; backends override with native paths) -----------------
    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

    async def read_file(self, path: str) -> bytes:
        out = await self._checked(f"base64 -w0 -- {quote(self._abs(path))}", f"reading {path}")
        return base64.b64decode(out.strip())

    async def read_text(self, path: str) -> str:
        return (await self.read_file(path)).decode("utf-8", errors="replace")

    async def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        raw = data.encode() if isinstance(data, str) else data
        dest = quote(self._abs(path))
        await self._checked(f'mkdir -p -- "$(dirname -- {dest})" && : > {dest}', f"writing {path}")
        for i in range(0, len(raw), _CHUNK):
            b64 = base64.b64encode(raw[i : i + _CHUNK]).decode()
            await self._checked(f"printf %s {b64} | base64 -d >> {dest}", f"writing {path}")
        if mode is not None:
            await self._checked(f"chmod {mode:o} -- {dest}", f"chmod {path}")

    async def upload(self, src: str | Path, dest: str) -> None:
        """Copy a host file or directory to `dest` inside the sandbox."""
        src = Path(src)
        if src.is_file():
            await self.write_file(dest, src.read_bytes(), mode=src.stat().st_mode & 0o777)
            return
        if not src.is_dir():
            raise SandboxError(f"upload source {src} does not exist")

        def pack() -> bytes:
            bio = io.BytesIO()
            with tarfile.open(fileobj=bio, mode="w:gz") as tar:
                tar.add(src, arcname=".")
            return bio.getvalue()

        tmp = f"/tmp/.ua_upload_{secrets.token_hex(6)}.tgz"
        await self.write_file(tmp, await asyncio.to_thread(pack))
        d = quote(self._abs(dest))
        await self._checked(
            f"(mkdir -p -- {d} && tar -xzf {tmp} -C {d}; rc=$?; rm -f {tmp}; exit $rc)",
            f"unpacking into {dest}",
        )

    async def download(self, src: str, dest: str | Path) -> None:
        """Copy a file or directory from inside the sandbox to the host path `dest`."""
        dest = Path(dest)
        s = quote(self._abs(src))
        kind = (
            await self._checked(f"if [ -d {s} ]; then echo d; elif [ -e {s} ]; then echo f; fi", "stat")
        ).strip()
        if kind == "f":
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(await self.read_file(src))
        elif kind == "d":
            out = await self._checked(f"tar -czf - -C {s} . | base64 -w0", f"packing {src}")
            dest.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(base64.b64decode(out.strip())), mode="r:gz") as tar:
                tar.extractall(dest, filter="data")
        else:
            raise SandboxError(f"{src} does not exist in the sandbox")


async def probe(sandbox: Sandbox, timeout_s: float = 60.0) -> tuple[bool, str]:
    """Start `sandbox`, run one command in it and stop it: each backend's `uniagent doctor` check.

    A backend counts as working only when a command really ran inside it, not when its
    binary or SDK merely exists.
    """
    try:
        async with asyncio.timeout(timeout_s):
            async with sandbox as sb:
                res = await sb.exec("echo uniagent-ok; id -un 2>/dev/null || id -u", timeout=20)
                lines = res.output.split()
                if res.exit_code != 0 or not lines or lines[0] != "uniagent-ok":
                    return False, f"`echo` in the sandbox gave exit {res.exit_code}: {res.output[:160]!r}"
                user = lines[1] if len(lines) > 1 else "?"
                return True, f"ran a command as {user}; started in {sb.start_time_s or 0:.2f}s"
    except TimeoutError:
        return False, f"no command ran within {timeout_s:g}s"
    except Exception as exc:
        return False, (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
