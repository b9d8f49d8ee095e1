"""A Modal cloud sandbox through the `modal` SDK (extra `uniagent[modal]`).

The container runs `sleep infinity`; every session is a bash process started with
`Sandbox.exec`. Modal's process handle is not an asyncio Process, so `PipeProcess` adapts
any pair of async byte streams to the few members `ShellSession` uses (stdin.write/drain/
close, stdout.readuntil/readline/read, returncode, kill, wait, communicate). The shared
session logic — markers, timeouts that SIGINT then SIGKILL the command's process tree,
restarts in the last cwd — then works unchanged. Files go through Modal's filesystem API
(binary), with the shell as a fallback.

Importing this module never imports `modal`; the SDK and the credentials are checked when
the sandbox starts, and their absence is a `ConfigError` that says how to fix it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any, Literal, cast

from pydantic import Field

from uniagent.errors import ConfigError, SandboxDeadError, SandboxError, SandboxStartError
from uniagent.sandbox.pipe import PipeShellSandbox
from uniagent.sandbox.procs import quote
from uniagent.sandbox.settings import SandboxConfig
from uniagent.sandbox.shell import ShellSession


class ModalConfig(SandboxConfig):
    """A Modal sandbox through the `modal` SDK (extra `uniagent[modal]`)."""

    type: Literal["modal"] = "modal"
    image: str = Field("python:3.11-slim", description="a registry image Modal can pull")
    app_name: str = "uniagent"
    timeout_s: int = Field(3600, ge=10, description="Modal's own lifetime limit for the sandbox")
    cpu: float | None = None
    memory_mb: int | None = None
    network: bool = False


log = logging.getLogger(__name__)

_WAIT_GRACE_S = 30.0
"""How long a closed process's exit status is still awaited."""
_STREAM_LIMIT = 1 << 24
"""StreamReader limit for `readuntil`; generous because a session reads its own markers only."""


# -- an asyncio-Process lookalike over async byte streams ----------------------------------
class _Stdin:
    """`write` buffers, `drain` sends; send failures look like a closed pipe (BrokenPipeError),
    which is what `ShellSession` treats as a dead shell."""

    def __init__(
        self, send: Callable[[bytes], Awaitable[None]], close: Callable[[], Awaitable[None]]
    ) -> None:
        self._send = send
        self._close = close
        self._buf = bytearray()
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None

    def write(self, data: bytes) -> None:
        if self._closing:
            raise BrokenPipeError("stdin is closed")
        self._buf += data

    async def drain(self) -> None:
        if not self._buf:
            return
        data = bytes(self._buf)
        self._buf.clear()
        try:
            await self._send(data)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise BrokenPipeError(f"writing to the process failed: {exc}") from exc

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Send EOF (a shell reading its commands then exits). Non-blocking, like a transport."""
        if self._closing:
            return
        self._closing = True
        self._close_task = asyncio.get_running_loop().create_task(self._eof())

    async def _eof(self) -> None:
        with contextlib.suppress(Exception):
            await self._close()


class PipeProcess:
    """Looks like `asyncio.subprocess.Process` to `ShellSession`, over async callables.

    send: write bytes to the process's stdin. close_stdin: send EOF. chunks: the process's
    stdout as it arrives. wait_exit: wait for the exit code. kill: end the process (the
    remote API may offer no signal; closing stdin is always tried first).
    """

    def __init__(
        self,
        *,
        send: Callable[[bytes], Awaitable[None]],
        close_stdin: Callable[[], Awaitable[None]],
        chunks: AsyncIterator[bytes],
        wait_exit: Callable[[], Awaitable[int | None]],
        kill: Callable[[], Awaitable[None]] | None = None,
        pid: int | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = _Stdin(send, close_stdin)
        self.stdout = asyncio.StreamReader(limit=_STREAM_LIMIT)
        self.stderr = None
        self._kill = kill
        self._kill_task: asyncio.Task[None] | None = None
        self._pump_task = loop.create_task(self._pump(chunks))
        self._wait_task = loop.create_task(self._wait(wait_exit))
        self._transport = SimpleNamespace(close=self._close_transport)

    async def _pump(self, chunks: AsyncIterator[bytes]) -> None:
        try:
            async for chunk in chunks:
                if chunk:
                    self.stdout.feed_data(chunk if isinstance(chunk, bytes) else str(chunk).encode())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a lost stream ends the output; the session sees EOF
            log.debug("process output stream ended with %s", exc)
        finally:
            self.stdout.feed_eof()

    async def _wait(self, wait_exit: Callable[[], Awaitable[int | None]]) -> None:
        try:
            code = await wait_exit()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("waiting for the process failed: %s", exc)
            code = None
        self.returncode = -9 if code is None else int(code)

    async def wait(self) -> int:
        if not self._wait_task.done():
            # asyncio.wait: a cancelled caller does not cancel the shared waiter, and a waiter
            # abandoned by _close_transport does not raise here.
            await asyncio.wait({self._wait_task})
        if self.returncode is None:
            self.returncode = -9
        return self.returncode

    def kill(self) -> None:
        """Close stdin and run the kill callback in the background (`kill` is sync in asyncio)."""
        self.stdin.close()
        if self._kill is not None and self._kill_task is None and self.returncode is None:
            self._kill_task = asyncio.get_running_loop().create_task(self._run_kill())

    terminate = kill

    async def _run_kill(self) -> None:
        assert self._kill is not None
        with contextlib.suppress(Exception):
            await self._kill()

    async def communicate(self, input: bytes | None = None) -> tuple[bytes, None]:
        """Send `input`, close stdin, read all output, wait for the exit (one-shot commands)."""
        if input:
            self.stdin.write(input)
            await self.stdin.drain()
        self.stdin.close()
        out = await self.stdout.read()
        await self.wait()
        return out, None

    def _close_transport(self) -> None:
        """Like closing an asyncio subprocess transport: drop the output pipe, kill the process
        if it still runs, and let `wait()` go on (for a while: a remote exit status that never
        comes must not keep a task alive forever)."""
        if not self._pump_task.done():
            self._pump_task.cancel()
        if self.returncode is None:
            self.kill()
            asyncio.get_running_loop().call_later(_WAIT_GRACE_S, self._wait_task.cancel)


# -- Modal ---------------------------------------------------------------------------------
def _import_modal() -> Any:
    try:
        import modal
    except ImportError:
        raise ConfigError(
            "sandbox type `modal` needs the Modal SDK: pip install 'uniagent[modal]' (or pip install modal)"
        ) from None
    return modal


def _has_credentials(modal: Any) -> bool:
    """Token pair or OAuth credentials from MODAL_* variables or ~/.modal.toml, or running
    inside Modal itself (which injects its own)."""
    if os.environ.get("MODAL_TASK_ID"):
        return True
    cfg = modal.config.config

    def get(key: str) -> Any:
        try:
            return cfg.get(key)
        except KeyError:
            return None

    return bool(get("token_id") and get("token_secret")) or bool(get("oauth_refresh_token"))


class ModalSandbox(PipeShellSandbox):
    """A Modal Sandbox. Sessions are bash processes from `Sandbox.exec` behind `PipeProcess`."""

    kind = "modal"

    def __init__(self, config: ModalConfig) -> None:
        super().__init__(config)
        self._modal: Any = None
        self._sb: Any = None

    def __repr__(self) -> str:
        sid = getattr(self._sb, "object_id", None) or "unstarted"
        return f"<ModalSandbox {self.config.image} {sid}>"

    async def _start(self) -> None:
        cfg: ModalConfig = self.config
        modal = _import_modal()
        if not _has_credentials(modal):
            raise ConfigError(
                "sandbox type `modal` needs Modal credentials: run `modal token new` (writes ~/.modal.toml) "
                "or set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"
            )
        self._modal = modal
        lim = cfg.limits
        kwargs: dict[str, Any] = {
            "image": modal.Image.from_registry(cfg.image),
            "timeout": cfg.timeout_s,
            "block_network": not cfg.network,
        }
        cpu = cfg.cpu or lim.cpus
        memory = cfg.memory_mb or lim.memory_mb
        if cpu:
            kwargs["cpu"] = cpu
        if memory:
            kwargs["memory"] = memory
        try:
            app = await modal.App.lookup.aio(cfg.app_name, create_if_missing=True)
            self._sb = await modal.Sandbox.create.aio("sleep", "infinity", app=app, **kwargs)
            proc = await self._sb.exec.aio("mkdir", "-p", self.workdir, text=False)
            await proc.wait.aio()
        except modal.exception.AuthError as exc:
            raise ConfigError(
                f"Modal rejected the credentials ({exc}); run `modal token new` or fix MODAL_TOKEN_ID/SECRET"
            ) from None
        except modal.exception.Error as exc:
            raise SandboxStartError(
                f"Modal could not create the sandbox: {type(exc).__name__}: {exc}"
            ) from exc

    async def _stop(self) -> None:
        sb, self._sb = self._sb, None
        if sb is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sb.terminate.aio(), 60)

    async def _alive(self) -> bool:
        if self._sb is None:
            return False
        try:
            return await self._sb.poll.aio() is None
        except Exception:
            return False

    def _preamble(self) -> str:
        """Limits Modal does not offer become shell rlimits of the session (and so of every command)."""
        lines = self.config.limits.ulimit_lines()
        return "\n".join([*(f"{x} 2>/dev/null" for x in lines), super()._preamble()])

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        if self._sb is None:
            raise SandboxDeadError("the modal sandbox is not running")
        modal = self._modal
        try:
            proc = await self._sb.exec.aio(
                *argv, text=False, stderr=modal.stream_type.StreamType.DEVNULL, workdir=self.workdir
            )
        except modal.exception.Error as exc:
            if not await self._alive():
                raise SandboxDeadError(f"the modal sandbox died: {exc}") from None
            raise OSError(f"Modal exec failed: {exc}") from exc
        # A PipeProcess has every member of a Process that ShellSession uses (module docstring).
        return cast(asyncio.subprocess.Process, modal_process(proc))

    async def _run(self, *argv: str) -> None:
        """A one-off command (signals); its output is discarded."""
        p = await self._spawn(list(argv))
        await asyncio.wait_for(p.communicate(), 30)

    async def _signal_shell(self, session: ShellSession, sig: int) -> None:
        if session.shell_pid is not None:
            await self._run("kill", f"-{int(sig)}", str(session.shell_pid))

    # -- files: Modal's filesystem API (bytes), the shell when it is missing --------------
    def _fs(self) -> Any:
        return getattr(self._sb, "filesystem", None) if self._sb is not None else None

    async def read_file(self, path: str) -> bytes:
        fs = self._fs()
        if fs is None:
            return await super().read_file(path)
        exc_mod = self._modal.exception
        try:
            return bytes(await fs.read_bytes.aio(self._abs(path)))
        except getattr(exc_mod, "SandboxFilesystemNotFoundError", ()) as exc:
            raise SandboxError(f"{path}: no such file in the sandbox") from exc
        except getattr(exc_mod, "SandboxFilesystemFileTooLargeError", ()):
            return await super().read_file(path)
        except exc_mod.Error as exc:
            raise SandboxError(f"reading {path} failed: {exc}") from exc

    async def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        fs = self._fs()
        if fs is None:
            await super().write_file(path, data, mode)
            return
        raw = data.encode() if isinstance(data, str) else data
        try:
            await fs.write_bytes.aio(raw, self._abs(path))
        except self._modal.exception.Error as exc:
            raise SandboxError(f"writing {path} failed: {exc}") from exc
        if mode is not None:
            await self._checked(f"chmod {mode:o} -- {quote(self._abs(path))}", f"chmod {path}")


def modal_process(proc: Any) -> PipeProcess:
    """Wrap a Modal `ContainerProcess[bytes]` (from `Sandbox.exec(..., text=False)`)."""

    async def send(data: bytes) -> None:
        proc.stdin.write(data)
        await proc.stdin.drain.aio()

    async def close_stdin() -> None:
        proc.stdin.write_eof()
        await proc.stdin.drain.aio()

    async def chunks() -> AsyncIterator[bytes]:
        async for chunk in proc.stdout:
            yield chunk

    async def wait_exit() -> int | None:
        return await proc.wait.aio()

    return PipeProcess(send=send, close_stdin=close_stdin, chunks=chunks(), wait_exit=wait_exit)


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor`: with the SDK and credentials, start a Modal sandbox and run a command
    (a few seconds of cloud time); without them, say what is missing (`None`: not set up)."""
    from uniagent.sandbox.base import probe

    name = "sandbox modal"
    try:
        modal = _import_modal()
    except ConfigError:
        return [(name, None, "SDK not installed: pip install 'uniagent[modal]'")]
    if not _has_credentials(modal):
        return [(name, None, "no credentials: modal token new (or MODAL_TOKEN_ID/MODAL_TOKEN_SECRET)")]
    ok, detail = await probe(ModalSandbox(ModalConfig(start_retries=0, start_timeout_s=120)), 180)
    return [(name, ok, detail)]
