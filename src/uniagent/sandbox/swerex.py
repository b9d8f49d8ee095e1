"""A SWE-ReX server as a sandbox: one already running (URL + token), or one uniagent starts.

SWE-ReX speaks HTTP, not pipes, so this backend does not use the shared `ShellSession`; it
maps the contract onto SWE-ReX's own concepts instead:

* a session is a SWE-ReX bash session (`CreateBashSessionRequest`); a command is a
  `BashAction` run with `run_in_session`. The server drives bash through a pty, so every
  command travels as one line, `eval $'…'` with every byte outside printable ASCII escaped:
  no tab can trigger readline completion, no newline can end the line early, and SWE-ReX's
  command splitter (bashlex) always sees a single simple command. The line prints a start
  and an end marker around the command; the end marker carries the exit code and the cwd,
  so SWE-ReX's own exit-code round trip (`check="silent"`, a second pexpect send of ~50 ms)
  is not needed (`check="ignore"`) and the output is exactly what the command printed.
* a command that runs past its timeout comes back as `CommandTimeoutError`; the session is
  then interrupted with `BashInterruptAction` (Ctrl-C on the pty), which keeps the shell
  with its cwd and variables. A shell that cannot be interrupted or that exited is replaced
  on the next command, in its last working directory, and that command's output says so.
* SWE-ReX's `read_file`/`write_file` are text-only (`Path.read_text`), so files go through
  `execute` + base64 (reads, downloads) and through the multipart `upload` endpoint (writes;
  directories as a tar.gz, which keeps modes and symlinks, unlike SWE-ReX's zip).
* exceptions the server raises travel back by class name; they become `uniagent.errors`:
  an unreachable server is `SandboxDeadError`, a rejected token a `ConfigError` at start
  (retrying cannot fix it) and a `SandboxError` later.

The auth token is a secret: it is kept out of `self.config`, reprs, logs and error
messages, and a server uniagent starts reads it from a pipe (never argv or the environment
the agent's shells inherit).

In "started" mode the server runs inside another uniagent backend (`inner`, default a
`local` sandbox with network so that its loopback is this machine's): see swerex_server.py.

Split by responsibility: swerex_client.py is the HTTP client (deadlines, token-safe errors),
swerex_session.py the session protocol above, swerex_server.py the server uniagent starts, and
this module the Sandbox that ties them together (lifecycle, request errors, files).
"""

from __future__ import annotations

import asyncio
import io
import logging
import re
import secrets
import tarfile
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Annotated, Any, Literal

import aiohttp
from pydantic import BeforeValidator, Field, PlainSerializer, model_validator
from swerex.runtime.abstract import Command, CommandResponse, UploadRequest

from uniagent.errors import ConfigError, SandboxDeadError, SandboxError, SandboxStartError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import as_written, parse_config
from uniagent.sandbox.procs import quote
from uniagent.sandbox.settings import SandboxConfig, type_of
from uniagent.sandbox.swerex_client import Client, HttpError, RedactingLog, RemoteError, redact
from uniagent.sandbox.swerex_server import SweRexServer, free_port
from uniagent.sandbox.swerex_session import SweRexSession


def _parse_inner(data: Any) -> SandboxConfig | None:
    """`inner` parsed by its `type` like a top-level section, its errors named under `inner`."""
    if data is None:
        return None
    try:
        return parse_config(data)
    except ConfigError as exc:
        msg = str(exc)
        where = f"inner.{msg.removeprefix('sandbox.')}" if msg.startswith("sandbox.") else f"inner: {msg}"
        raise ConfigError(f"sandbox.{where}") from None


class SweRexConfig(SandboxConfig):
    """A SWE-ReX server: remote (URL + token) or started by uniagent inside another backend."""

    type: Literal["swerex"] = "swerex"
    url: str | None = Field(None, description="a running swerex-remote server; unset: start one")
    port: int | None = None
    auth_token: str | None = Field(None, repr=False, description="secret: never logged or stored")
    inner: Annotated[
        SandboxConfig | None,
        BeforeValidator(_parse_inner),
        PlainSerializer(lambda c: None if c is None else as_written(c)),
    ] = Field(
        None,
        description="the backend to start the server in when `url` is unset, a sandbox section of "
        "its own (default: local with network)",
    )

    @model_validator(mode="after")
    def _inner_reachable(self) -> SweRexConfig:
        """uniagent reaches the server it starts on 127.0.0.1: the inner sandbox must share this
        machine's loopback, and cannot be another swerex sandbox."""
        if self.inner is None:
            return self
        kind = type_of(self.inner)
        if kind == "swerex":
            raise ConfigError(
                "sandbox.inner: a SWE-ReX server cannot be started inside another swerex sandbox"
            )
        if kind in ("local", "container") and not getattr(self.inner, "network", False):
            raise ConfigError(
                f"sandbox.inner: uniagent reaches the SWE-ReX server on 127.0.0.1, so the inner {kind} "
                "sandbox needs `network: true` (and for containers host networking, e.g. run_args: "
                '["--network", "host"])'
            )
        return self

    def inner_sandbox(self) -> SandboxConfig:
        """The config of the sandbox the server starts in: `inner` (default: local with network),
        with this section's limits (but its wall clock) unless `inner` sets its own."""
        inner = self.inner or parse_config({"type": "local", "network": True})
        if "limits" in inner.model_fields_set:
            return inner
        return parse_config({**as_written(inner), "limits": self.limits.model_dump(exclude={"wall_clock_s"})})

    def inner_type(self) -> str:
        return type_of(self.inner) if self.inner is not None else "local"


__all__ = ["SweRexSandbox", "SweRexSession", "doctor_check", "free_port"]

log = logging.getLogger(__name__)

_limits_noted = False


def _first_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:limit]


class SweRexSandbox(Sandbox):
    """A sandbox served by SWE-ReX (`swerex-remote`). See the module docstring."""

    kind = "swerex"

    def __init__(self, config: SweRexConfig) -> None:
        # The token lives here only; the stored config is a copy without it, so that neither
        # `sandbox.config` nor anything that dumps it can leak it.
        self._token: str | None = config.auth_token
        super().__init__(config.model_copy(update={"auth_token": None}))
        self.id = secrets.token_hex(4)
        self._client: Client | None = None
        self._server: SweRexServer | None = None
        self._url: str | None = None

    def __repr__(self) -> str:
        mode = "remote" if self.config.url else f"started in {self.config.inner_type()}"
        state = "stopped" if self._stopped else "running" if self._started else "unstarted"
        return f"<SweRexSandbox {mode} url={self._url or self.config.url or '?'} {state}>"

    __str__ = __repr__

    @property
    def url(self) -> str | None:
        """Where the server listens (known once started)."""
        return self._url

    @property
    def rex(self) -> Client:
        """The server's client (`SessionServer.rex`); a stopped sandbox has none."""
        if self._client is None:
            raise SandboxDeadError("the swerex sandbox is not running (start it first)")
        return self._client

    # -- lifecycle -----------------------------------------------------------------------
    async def _start(self) -> None:
        global _limits_noted
        cfg: SweRexConfig = self.config
        if cfg.url:
            host = cfg.url if "://" in cfg.url else f"http://{cfg.url}"
            self._url = f"{host}:{cfg.port}" if cfg.port else host
            self._client = self._new_client(host, cfg.port, self._token or "")
            await self._check_reachable()
            if not _limits_noted:
                _limits_noted = True
                log.info("a remote SWE-ReX server enforces no uniagent limits; it runs with its own")
            return
        await self._start_server()

    def _new_client(self, host: str, port: int | None, token: str) -> Client:
        return Client(host=host, port=port, token=token, logger=RedactingLog(log, token))  # type: ignore[arg-type]

    async def _check_reachable(self) -> None:
        resp = await self.rex.is_alive(timeout=min(self.config.start_timeout_s, 30.0))
        if resp.is_alive:
            return
        msg = redact(resp.message, self._token)
        if re.search(r"Status code (401|403)\b", msg):
            await self.rex.aclose()
            raise ConfigError(
                f"sandbox.auth_token: the SWE-ReX server at {self._url} rejected the token "
                f"({_first_line(msg)}); give the value its swerex-remote was started with (--auth-token)"
            )
        raise SandboxStartError(f"the SWE-ReX server at {self._url} is not reachable: {_first_line(msg)}")

    async def _start_server(self) -> None:
        """Start `swerex-remote` inside the inner sandbox and connect to it."""
        cfg: SweRexConfig = self.config
        self._server = server = SweRexServer(cfg.inner_sandbox(), cfg.port, self.id)
        inner = await server.start_inner()
        if "workdir" not in cfg.model_fields_set:
            self.workdir = inner.workdir
        self.tools_dir = inner.tools_dir
        token = self._token or secrets.token_urlsafe(24)
        self._token = token
        port = await server.launch(token, self.workdir)
        self._url = f"http://127.0.0.1:{port}"
        self._client = self._new_client("http://127.0.0.1", port, token)
        await server.wait_ready(self._client, token)

    async def _close_sessions(self) -> None:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        if self._client is not None and self._server is None:
            # A server we did not start may be shared: close only our own sessions. (One we
            # started goes away whole, its shells with it.)
            for s in sessions:
                await s.close()

    async def _stop(self) -> None:
        client, server = self._client, self._server
        if client is not None:
            await client.aclose()
        self._client = None
        self._server = None
        if server is not None:
            await server.stop()

    async def _alive(self) -> bool:
        if self._client is None:
            return False
        if self._server is not None and not await self._server.alive():
            return False
        try:
            return bool(await self._client.is_alive(timeout=5.0))
        except Exception:
            return False

    async def _open_session(self, name: str) -> SweRexSession:
        """A persistent SWE-ReX bash session (see swerex_session.py)."""
        # The workdir may not exist on a server uniagent did not set up; relative paths of the
        # file methods resolve against it too, so create it rather than run elsewhere.
        setup = f"mkdir -p -- {quote(self.workdir)} 2>/dev/null\n{self._preamble()}"
        sess = SweRexSession(
            self, name, prefix=f"ua-{self.id}", setup=setup, start_timeout_s=self.config.start_timeout_s
        )
        await sess.start()
        return sess

    async def call(self, request: Awaitable[Any], what: str) -> Any:
        """Await one SWE-ReX request; transport failures become uniagent errors (`SessionServer.call`).

        `RemoteError` (an exception raised by the server) passes through for the caller to map.
        """
        try:
            return await request
        except RemoteError:
            raise
        except HttpError as exc:
            if exc.status in (401, 403):
                raise SandboxError(
                    f"{what}: the SWE-ReX server at {self._url} rejected the auth token ({exc.status})"
                ) from None
            raise SandboxError(
                f"{what}: the SWE-ReX server answered {redact(str(exc), self._token)}"
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            reason = redact(f"{type(exc).__name__}: {exc}", self._token)
            if self._stopped or not await self._alive():
                raise SandboxDeadError(
                    f"the swerex sandbox died: the server at {self._url} does not answer ({reason})"
                ) from None
            raise SandboxError(f"{what}: request to the SWE-ReX server failed ({reason})") from None

    async def _execute(self, command: str, what: str, timeout: float = 300) -> str:
        """Run a `bash -c` command outside the sessions (SWE-ReX `execute`); its stdout."""
        if not self._started or self._stopped:
            raise SandboxDeadError("the swerex sandbox is not running (start it first)")
        try:
            res: CommandResponse = await self.call(
                self.rex.execute(Command(command=["bash", "-c", command], timeout=timeout)), what
            )
        except RemoteError as exc:
            raise SandboxError(f"{what} failed: {exc.name}: {str(exc)[:300]}") from None
        if res.exit_code != 0:
            err = (res.stderr or res.stdout).strip()[-500:]
            raise SandboxError(f"{what} failed (exit {res.exit_code}): {err}")
        return res.stdout

    async def _checked(self, command: str, what: str, timeout: float = 300) -> str:
        """The base class's checked command, outside the sessions (upload uses it)."""
        return await self._execute(command, what, timeout)

    async def _put(self, data: bytes, dest: str) -> None:
        """Write bytes to an absolute path through the multipart upload endpoint (binary-safe)."""
        with tempfile.TemporaryDirectory(prefix="uniagent-swerex-") as tmp:
            src = Path(tmp) / "data"
            await asyncio.to_thread(src.write_bytes, data)
            try:
                await self.call(
                    self.rex.upload(UploadRequest(source_path=str(src), target_path=dest)), f"writing {dest}"
                )
            except RemoteError as exc:
                raise SandboxError(f"writing {dest} failed: {exc.name}: {str(exc)[:300]}") from None

    # -- files ---------------------------------------------------------------------------
    async def read_file(self, path: str) -> bytes:
        """SWE-ReX's read_file decodes text; base64 through `execute` keeps every byte."""
        import base64

        out = await self._execute(f"base64 -w0 -- {quote(self._abs(path))}", f"reading {path}")
        return base64.b64decode(out.strip())

    async def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        raw = data.encode() if isinstance(data, str) else data
        dest = self._abs(path)
        await self._put(raw, dest)
        if mode is not None:
            await self._execute(f"chmod {mode:o} -- {quote(dest)}", f"chmod {path}")

    async def download(self, src: str, dest: str | Path) -> None:
        """Copy a file or directory from inside the sandbox to the host path `dest`."""
        import base64

        dest = Path(dest)
        s = quote(self._abs(src))
        out = await self._execute(
            f"if [ -d {s} ]; then printf d; tar -czf - -C {s} . | base64 -w0; "
            f"elif [ -e {s} ]; then printf f; base64 -w0 -- {s}; else echo 'no such file' >&2; exit 3; fi",
            f"downloading {src}",
        )
        kind, payload = out[:1], base64.b64decode(out[1:].strip())
        if kind == "f":
            dest.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(dest.write_bytes, payload)
            return
        dest.mkdir(parents=True, exist_ok=True)

        def unpack() -> None:
            with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as tar:
                tar.extractall(dest, filter="data")

        await asyncio.to_thread(unpack)


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor`: start a SWE-ReX server in the default inner sandbox and run a command
    through it."""
    from uniagent.sandbox.base import probe

    ok, detail = await probe(SweRexSandbox(SweRexConfig(start_retries=0, start_timeout_s=60)), 90)
    return [("sandbox swerex (server in a local sandbox)", ok, detail)]
