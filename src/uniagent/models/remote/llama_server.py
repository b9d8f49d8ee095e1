"""Find and launch llama.cpp's `llama-server` on loopback (tests, benchmarks, `uniagent` users
without a server of their own).

The binary comes from `uniagent.models.remote.llama_build` (`make llama-server`): llama.cpp as
vendored in the pinned `llama-cpp-python` sdist, built once per CPU, smoke-tested, and cached under
`${UNIAGENT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/uniagent}/llama-server/<key>/llama-server`, with
`current` linking to the variant chosen for this CPU. `UNIAGENT_LLAMA_SERVER=/path` overrides the cache, and a
`llama-server` on PATH is the last resort.

`LlamaServer` serves one GGUF (default: the packaged SmolLM2) with `slots` parallel sequences of
`ctx_size` tokens each, waits until `/health` answers 200 (503 while the model loads), and on exit
stops the process and reaps it. Its output goes to a log file; a server that exits or never gets
healthy raises `EngineError` with the log's tail.

Threads wait passively (`OMP_WAIT_POLICY=passive`, unless the environment sets it or `spin=True`):
the server's OpenMP threads otherwise spin at every barrier, and when another process holds one of
the cores (a sandbox, the test runner, a trainer) a decode step waits a scheduler slice per barrier.
Measured on 2 busy cores (SmolLM2, 2 threads): 1.1-3 s per generated token spinning, 28-29 ms
passive. `spin=True` keeps OpenMP's default, for a machine whose cores are the server's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

from uniagent.errors import EngineError
from uniagent.models.remote import llama_build
from uniagent.models.remote.llama_command import default_gguf, free_port, server_command

ENV_BINARY = "UNIAGENT_LLAMA_SERVER"
BUILD_HINT = "build it with `make llama-server` or set UNIAGENT_LLAMA_SERVER=/path/to/llama-server"


def find_binary() -> str | None:
    """The llama-server to run: $UNIAGENT_LLAMA_SERVER, else the cached build, else PATH; None if
    there is none (a set $UNIAGENT_LLAMA_SERVER that is not an executable is an error, not a miss).

    A cached build is only returned once it has generated on this CPU (`llama_build.verified`: run
    once per CPU and recorded beside the binary), so a cache carried over from another machine
    cannot hand out a binary that crashes here."""
    explicit = os.environ.get(ENV_BINARY)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise EngineError(f"{ENV_BINARY}={explicit} is not an executable file; {BUILD_HINT}")
        return explicit
    cached = llama_build.cache_root() / "current" / "llama-server"
    if os.access(cached, os.X_OK):
        result = llama_build.verified(cached.resolve())
        if not result.ok:
            raise EngineError(
                f"the cached llama-server {cached.resolve()} does not work on this CPU ({result.detail}); "
                "`make llama-server` builds one that does"
            )
        return str(cached)
    return shutil.which("llama-server")


def require_binary() -> str:
    """`find_binary()` or an `EngineError` saying how to get one."""
    found = find_binary()
    if found is None:
        raise EngineError(f"no llama-server binary found; {BUILD_HINT}")
    return found


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGTERM when the process that started it dies (a crashed test run
    leaves no server behind)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LlamaServer:
    """`async with LlamaServer(slots=8) as srv:` ... `srv.url` ... (stopped and reaped on exit)."""

    def __init__(
        self,
        gguf: str | None = None,
        *,
        slots: int = 1,
        ctx_size: int = 8192,
        host: str = "127.0.0.1",
        port: int | None = None,
        threads: int | None = None,
        binary: str | None = None,
        startup_timeout_s: float = 120.0,
        extra_args: list[str] | None = None,
        log_path: str | None = None,
        spin: bool = False,
    ) -> None:
        self.gguf = default_gguf() if gguf is None else gguf
        self.slots = slots
        self.ctx_size = ctx_size
        self.host = host
        self.port = port
        self.threads = threads
        self.binary = binary
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = list(extra_args or [])
        self.log_path = log_path
        self._own_log = log_path is None
        self.spin = spin
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise EngineError("LlamaServer has not been started")
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The command line (`llama_command.server_command`), with the binary found if none was given."""
        return server_command(
            self.binary or require_binary(),
            self.gguf,
            host=self.host,
            port=self.port,
            slots=self.slots,
            ctx_size=self.ctx_size,
            threads=self.threads,
            extra_args=self.extra_args,
        )

    async def start(self) -> LlamaServer:
        if self.process is not None:
            return self
        if not Path(self.gguf).is_file():
            raise EngineError(f"llama-server: no GGUF file at {self.gguf}")
        if self.port is None:
            self.port = free_port(self.host)
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
        cmd = self.command()
        env = dict(os.environ)
        if not self.spin:
            env.setdefault("OMP_WAIT_POLICY", "passive")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise
        return self

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise EngineError(
                        f"llama-server exited with status {self.process.returncode} while starting "
                        f"({' '.join(self.command()[:1])}):\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"llama-server at {self.url} not healthy after {self.startup_timeout_s:.0f} s:"
                        f"\n{self.log_tail()}"
                    )
                await asyncio.sleep(0.05)

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = Path(self.log_path or "").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """Kill the server at once (tests: a server dying under a run)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()

    async def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; always reaps the process. A log file this object
        created is removed (a failed start has put its tail in the error already)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
        await asyncio.to_thread(process.wait)
        if self._own_log and self.log_path:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)

    async def __aenter__(self) -> LlamaServer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
