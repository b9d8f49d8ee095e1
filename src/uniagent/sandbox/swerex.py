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
`local` sandbox with network so that its loopback is this machine's), launched from a
dedicated session of that sandbox so that timeouts in other sessions never touch it. On
stop, the server's process tree is killed before the inner sandbox is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
import secrets
import signal
import socket
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel
from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    Command,
    CommandResponse,
    CreateBashSessionRequest,
    UploadRequest,
)
from swerex.runtime.remote import RemoteRuntime

from uniagent.errors import ConfigError, SandboxDeadError, SandboxError, SandboxStartError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import SweRexConfig
from uniagent.sandbox.output import clip_text
from uniagent.sandbox.procs import quote, tree_signal_script
from uniagent.sandbox.shell import ExecResult

log = logging.getLogger(__name__)

SERVER_SESSION = "_swerex_server"
"""The inner sandbox's session that launches the server (and is never used for anything else)."""

_SLACK_S = 30.0
"""Client-side deadline beyond a request's own timeout: the server checks syntax, expects the
prompt and eats trailing output before it answers."""

_DEFAULT_DEADLINE_S = 300.0
_SESSION_SETUP = "set +H; export PAGER=cat GIT_PAGER=cat MANPAGER=cat SYSTEMD_PAGER=cat"
"""A pty makes programs think a human is watching: pagers would wait for a key forever."""

# Reads the token from stdin so it is in neither argv (visible to every user in `ps`) nor the
# environment that the server's bash sessions inherit.
_SERVER_BOOT = (
    "import sys\n"
    "token = sys.stdin.readline().strip()\n"
    "sys.argv = ['swerex-remote', '--host', '127.0.0.1', '--port', sys.argv[1], '--auth-token=' + token]\n"
    "from swerex.server import main\n"
    "main()\n"
)

_limits_noted = False


# -- SWE-ReX's client, with deadlines ------------------------------------------------------
class _RemoteError(Exception):
    """An exception raised inside the server, carried back by class name (SWE-ReX's transfer)."""

    def __init__(self, class_path: str, message: str) -> None:
        super().__init__(message)
        self.class_path = class_path
        self.name = class_path.rpartition(".")[2]


class _HttpError(Exception):
    """A 4xx/5xx answer without a transferred exception (401/403: wrong token)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


class _Client(RemoteRuntime):
    """SWE-ReX's `RemoteRuntime` with three changes that a sandbox needs.

    * Every request has a deadline derived from its own timeout: the stock client posts with
      aiohttp's 5-minute default, so a 10-minute test run would fail on the client while the
      server kept running it, and a hung server would hang the episode forever.
    * One `aiohttp.ClientSession` per sandbox instead of one per request.
    * Server-side exceptions become `_RemoteError` without the stock client's `print()` and
      critical-level traceback log (a timeout is an ordinary event here), and HTTP errors
      become `_HttpError`, whose repr, unlike aiohttp's, does not carry the request headers,
      i.e. the token.
    """

    def __init__(self, *, host: str, port: int | None, token: str, logger: logging.Logger) -> None:
        super().__init__(host=host, port=port, auth_token=token, timeout=10.0, logger=logger)
        self._http: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            # force_close: a kept-alive connection the server dropped while idle would look like
            # a dead server on the next POST (which must not be blindly retried).
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _handle_transfer_exception(self, exc_transfer: Any) -> None:
        raise _RemoteError(exc_transfer.class_path, exc_transfer.message)

    async def _handle_response_errors(self, response: aiohttp.ClientResponse) -> None:
        if response.status == 511:
            data = await response.json()
            exc = data.get("swerexception", {})
            raise _RemoteError(str(exc.get("class_path", "")), str(exc.get("message", "")))
        if response.status >= 400:
            try:
                detail = str((await response.json()).get("detail", response.reason))
            except Exception:
                detail = str(response.reason)
            raise _HttpError(response.status, detail)

    async def _request(
        self, endpoint: str, payload: BaseModel | None, output_class: Any, num_retries: int = 0
    ) -> Any:
        own = getattr(payload, "timeout", None) or getattr(payload, "startup_timeout", None)
        deadline = own + _SLACK_S if own else _DEFAULT_DEADLINE_S
        headers = {**self._headers, "X-Request-ID": str(uuid.uuid4())}
        body = payload.model_dump() if payload is not None else None
        for attempt in range(2):
            try:
                async with self._client().post(
                    f"{self._api_url}/{endpoint}",
                    json=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=deadline, sock_connect=30),
                ) as resp:
                    await self._handle_response_errors(resp)
                    return output_class(**await resp.json())
            except aiohttp.ClientConnectorError:
                # Nothing was sent: safe to retry once (a server restarting, a full backlog).
                if attempt:
                    raise
                await asyncio.sleep(0.2)
        raise AssertionError("unreachable")


class _RedactingLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The logger SWE-ReX's client writes to: anything that contains the token is masked."""

    def __init__(self, logger: logging.Logger, token: str) -> None:
        super().__init__(logger, {})
        self._token = token

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        text = str(msg) % args if args else str(msg)
        kwargs.pop("exc_info", None)  # tracebacks may hold aiohttp errors that repr the headers
        self.logger.log(level, "%s", _redact(text, self._token), **kwargs)


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


# -- helpers -------------------------------------------------------------------------------
def _ansi_c(command: str) -> str:
    """`command` as one bash `$'…'` word of printable ASCII (see the module docstring)."""
    out = []
    for b in command.encode():
        if 0x20 <= b < 0x7F and b not in (0x27, 0x5C, 0x21):  # ' \ ! are escaped too
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (a race is retried by the start loop)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _first_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:limit]


class SweRexSession:
    """One SWE-ReX bash session. Commands run one at a time (a lock serialises them).

    The SWE-ReX server runs every command on its event loop, so commands in different
    sessions of one server also run one after the other; their state stays separate.
    """

    def __init__(self, box: SweRexSandbox, name: str) -> None:
        self.box = box
        self.name = name
        self.token = "__UA_" + secrets.token_hex(8)
        self.cwd: str | None = None
        self.restarts = 0
        self._generation = 0
        self._seq = 0
        self._open = False
        self._lost: str | None = None  # why the previous shell ended, for the next command's note
        self._closed = False
        self._lock = asyncio.Lock()

    @property
    def remote_name(self) -> str:
        return f"ua-{self.box.id}-{self.name}-{self._generation}"

    def alive(self) -> bool:
        return self._open and not self._closed

    async def start(self) -> None:
        """Create the bash session on the server and set PATH, env and cwd in it."""
        box = self.box
        await box._call(
            box._rex.create_session(
                CreateBashSessionRequest(
                    session=self.remote_name, startup_timeout=min(box.config.start_timeout_s, 30.0)
                )
            ),
            f"creating session {self.name!r}",
        )
        self._open = True
        # The workdir may not exist on a server uniagent did not set up; relative paths of the
        # file methods resolve against it too, so create it rather than run elsewhere.
        setup = f"{_SESSION_SETUP}\nmkdir -p -- {quote(box.workdir)} 2>/dev/null\n{box._preamble()}"
        if self.cwd:
            setup += f"\ncd -- {quote(self.cwd)} 2>/dev/null || true"
        res = await self._run_once(setup, box.config.start_timeout_s, None)
        if res.exit_code is None:
            raise SandboxDeadError(f"session {self.name!r} did not start: {res.output.strip()[-300:]}")

    async def run(self, command: str, timeout: float, max_output: int | None) -> ExecResult:
        async with self._lock:
            if self._closed:
                raise SandboxDeadError(f"shell session {self.name!r} is closed")
            note = ""
            if not self._open:
                if self._lost is not None:
                    self.restarts += 1
                    note = (
                        f"[the previous shell ended ({self._lost}); this command runs in a new shell in "
                        f"{self.cwd or 'the start directory'}; variables set before are gone]\n"
                    )
                    self._generation += 1
                    self._lost = None
                await self.start()
            result = await self._run_once(command, timeout, max_output)
            if note:
                result.output = note + result.output
            return result

    async def _run_once(self, command: str, timeout: float, max_output: int | None) -> ExecResult:
        if "\0" in command:
            return ExecResult(2, "the command contains a NUL byte, which a shell cannot run", cwd=self.cwd)
        box = self.box
        self._seq += 1
        tag = f"{self.token}-{self._seq}"
        line = (
            f"printf '%s\\n' {tag}-start; eval {_ansi_c(command)} </dev/null; __ua_rc=$?; "
            f'printf \'\\n%s %d %s\\n\' {tag} "$__ua_rc" "$PWD"'
        )
        action = BashAction(command=line, session=self.remote_name, timeout=timeout, check="ignore")
        started = time.perf_counter()
        try:
            obs = await box._call(box._rex.run_in_session(action), "running a command")
        except _RemoteError as exc:
            return await self._failed(exc, tag, timeout, max_output, started)
        body, code, cwd = self._parse(obs.output, tag)
        if cwd:
            self.cwd = cwd
        text, clipped = clip_text(body, max_output)
        return ExecResult(code, text, False, clipped, time.perf_counter() - started, self.cwd)

    async def _failed(
        self, exc: _RemoteError, tag: str, timeout: float, max_output: int | None, started: float
    ) -> ExecResult:
        """Map a server-side exception of a command: a timeout, a dead shell, or an error."""
        box = self.box
        if exc.name == "CommandTimeoutError":
            partial = ""
            try:
                obs = await box._call(
                    box._rex.run_in_session(
                        BashInterruptAction(session=self.remote_name, timeout=1.0, n_retry=3)
                    ),
                    "interrupting a command",
                )
                partial = self._parse(obs.output, tag)[0]
                lost = False
            except _RemoteError:
                await self._discard("it could not be interrupted")
                lost = True
            text, clipped = clip_text(partial, max_output)
            text += f"\n[the command timed out after {timeout:g}s and was interrupted]"
            if lost:
                text += "\n[the shell was restarted; variables set before are gone]"
            return ExecResult(None, text, True, clipped, time.perf_counter() - started, self.cwd)
        if exc.name in ("EOF", "SessionDoesNotExistError", "SessionNotInitializedError"):
            m = re.search(r"exitstatus: (\d+)", str(exc))
            code = int(m.group(1)) if m else None
            await self._discard(f"exit {code}" if code is not None else "it exited")
            return ExecResult(
                code,
                "[the shell exited; the next command starts a new shell]",
                False,
                False,
                time.perf_counter() - started,
                self.cwd,
            )
        raise SandboxError(f"the SWE-ReX server failed to run the command: {exc.name}: {str(exc)[:500]}")

    def _parse(self, output: str, tag: str) -> tuple[str, int | None, str | None]:
        """The command's own output between the markers; exit code and cwd from the end marker."""
        text = output.replace("\r\n", "\n")
        start = f"{tag}-start\n"
        i = text.find(start)
        begin = i + len(start) if i >= 0 else 0
        end = f"\n{tag} "
        j = text.find(end, begin)
        if j < 0:
            return text[begin:], None, None
        k = text.find("\n", j + len(end))
        rc, _, cwd = text[j + len(end) : k if k >= 0 else None].partition(" ")
        try:
            return text[begin:j], int(rc), cwd or None
        except ValueError:
            return text[begin:j], None, cwd or None

    async def _discard(self, why: str) -> None:
        """Forget the server's shell (closing it if it is still there); the next command restarts."""
        self._open = False
        self._lost = why
        with contextlib.suppress(Exception):
            await self.box._call(
                self.box._rex.close_session(CloseBashSessionRequest(session=self.remote_name)),
                "closing a session",
            )

    async def interrupt(self) -> None:
        """Ctrl-C whatever runs now. The server handles one request at a time, so this takes
        effect once the running request returns; a command's own timeout is the way to stop it."""
        await self.box._call(
            self.box._rex.run_in_session(BashInterruptAction(session=self.remote_name)), "interrupting"
        )

    async def close(self) -> None:
        self._closed = True
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.box._rex.close_session(CloseBashSessionRequest(session=self.remote_name)), 10
                )


class SweRexSandbox(Sandbox):
    """A sandbox served by SWE-ReX (`swerex-remote`). See the module docstring."""

    kind = "swerex"

    def __init__(self, config: SweRexConfig) -> None:
        # The token lives here only; the stored config is a copy without it, so that neither
        # `sandbox.config` nor anything that dumps it can leak it.
        self._token: str | None = config.auth_token
        super().__init__(config.model_copy(update={"auth_token": None}))
        self.id = secrets.token_hex(4)
        self._client: _Client | None = None
        self._inner: Sandbox | None = None
        self._server_pid: str | None = None
        self._server_log: str | None = None
        self._url: str | None = None
        self._rex_sessions: dict[str, SweRexSession] = {}
        self._session_lock = asyncio.Lock()

    def __repr__(self) -> str:
        mode = "remote" if self.config.url else f"started in {self._inner_type()}"
        state = "stopped" if self._stopped else "running" if self._started else "unstarted"
        return f"<SweRexSandbox {mode} url={self._url or self.config.url or '?'} {state}>"

    __str__ = __repr__

    @property
    def url(self) -> str | None:
        """Where the server listens (known once started)."""
        return self._url

    @property
    def _rex(self) -> _Client:
        if self._client is None:
            raise SandboxDeadError("the swerex sandbox is not running (start it first)")
        return self._client

    def _inner_type(self) -> str:
        return str((self.config.inner or {}).get("type", "local"))

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

    def _new_client(self, host: str, port: int | None, token: str) -> _Client:
        return _Client(host=host, port=port, token=token, logger=_RedactingLog(log, token))  # type: ignore[arg-type]

    async def _check_reachable(self) -> None:
        resp = await self._rex.is_alive(timeout=min(self.config.start_timeout_s, 30.0))
        if resp.is_alive:
            return
        msg = _redact(resp.message, self._token)
        if re.search(r"Status code (401|403)\b", msg):
            await self._rex.aclose()
            raise ConfigError(
                f"sandbox.auth_token: the SWE-ReX server at {self._url} rejected the token "
                f"({_first_line(msg)}); give the value its swerex-remote was started with (--auth-token)"
            )
        raise SandboxStartError(f"the SWE-ReX server at {self._url} is not reachable: {_first_line(msg)}")

    async def _start_server(self) -> None:
        """Start `swerex-remote` inside the inner sandbox and connect to it."""
        from uniagent.sandbox import create

        cfg: SweRexConfig = self.config
        inner_cfg: dict[str, Any] = (
            dict(cfg.inner) if cfg.inner is not None else {"type": "local", "network": True}
        )
        inner_type = inner_cfg.get("type", "local")
        if inner_type == "swerex":
            raise ConfigError(
                "sandbox.inner: a SWE-ReX server cannot be started inside another swerex sandbox"
            )
        if inner_type in ("local", "container") and not inner_cfg.get("network", False):
            raise ConfigError(
                f"sandbox.inner: uniagent reaches the SWE-ReX server on 127.0.0.1, so the inner {inner_type} "
                "sandbox needs `network: true` (and for containers host networking, e.g. run_args: "
                '["--network", "host"])'
            )
        if "limits" not in inner_cfg:
            inner_cfg["limits"] = cfg.limits.model_dump(exclude={"wall_clock_s"})
        inner = create(inner_cfg)
        self._inner = inner
        await inner.start()
        if "workdir" not in cfg.model_fields_set:
            self.workdir = inner.workdir
        self.tools_dir = inner.tools_dir

        found = await inner.exec(
            f"(for py in {quote(sys.executable)} python3 python; do "
            '"$py" -c "import importlib.util as u, sys; sys.exit(u.find_spec(\'swerex\') is None)" '
            '2>/dev/null && { command -v "$py" || echo "$py"; exit 0; }; done; exit 127)',
            timeout=60,
            session=SERVER_SESSION,
        )
        if not found.ok:
            raise SandboxStartError(
                f"no Python with SWE-ReX inside the inner {inner_type} sandbox: install it there "
                "(pip install swe-rex) or choose another `inner`"
            )
        python = found.output.strip().splitlines()[-1]
        port = cfg.port or free_port()
        token = self._token or secrets.token_urlsafe(24)
        self._token = token
        self._server_log = f"/tmp/.uniagent-swerex-{self.id}-{port}.log"
        launch = await inner.exec(
            f"cd -- {quote(self.workdir)} 2>/dev/null; "
            f"printf '%s\\n' {quote(token)} | {quote(python)} -c {quote(_SERVER_BOOT)} {port} "
            f"> {self._server_log} 2>&1 &\necho $!",
            timeout=30,
            session=SERVER_SESSION,
        )
        self._server_pid = launch.output.strip().splitlines()[-1] if launch.ok else None
        if not self._server_pid or not self._server_pid.isdigit():
            raise SandboxStartError(f"could not launch swerex-remote: {launch.output.strip()[-300:]}")
        self._url = f"http://127.0.0.1:{port}"
        self._client = self._new_client("http://127.0.0.1", port, token)
        await self._wait_for_server()

    async def _server_running(self) -> bool:
        assert self._inner is not None
        res = await self._inner.exec(
            f"kill -0 {self._server_pid} 2>/dev/null", timeout=10, session=SERVER_SESSION
        )
        return res.exit_code == 0

    async def _wait_for_server(self) -> None:
        """Poll `is_alive` until the server answers; fail fast (with its log) if it exits."""
        while True:
            if (await self._rex.is_alive(timeout=2.0)).is_alive:
                return
            if not await self._server_running():
                assert self._inner is not None
                tail = await self._inner.exec(
                    f"tail -c 2000 {self._server_log}", timeout=10, session=SERVER_SESSION
                )
                raise SandboxStartError(
                    "swerex-remote exited while starting: "
                    + _redact(tail.output.strip(), self._token)[-1500:]
                )
            await asyncio.sleep(0.05)

    async def _stop(self) -> None:
        sessions = list(self._rex_sessions.values())
        self._rex_sessions.clear()
        client, inner = self._client, self._inner
        if client is not None and inner is None:
            # A server we did not start may be shared: close only our own sessions.
            for s in sessions:
                await s.close()
        if client is not None:
            await client.aclose()
        self._client = None
        self._inner = None
        if inner is not None:
            if self._server_pid:
                # Kill the server and its shells first: not every backend's stop reaches processes
                # that were started in the background of one of its sessions.
                pid = int(self._server_pid)
                with contextlib.suppress(Exception):
                    await inner.exec(
                        f"{tree_signal_script(pid, signal.SIGKILL)}; kill -9 {pid} 2>/dev/null; true",
                        timeout=15,
                        session=SERVER_SESSION,
                    )
                self._server_pid = None
            await inner.stop()

    async def _alive(self) -> bool:
        if self._client is None:
            return False
        if self._inner is not None and not await self._inner.alive():
            return False
        try:
            return bool(await self._client.is_alive(timeout=5.0))
        except Exception:
            return False

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        raise SandboxError("a SWE-ReX sandbox has no pipes to spawn processes on; use exec or session")

    # -- requests ------------------------------------------------------------------------
    async def _call(self, request: Any, what: str) -> Any:
        """Await one SWE-ReX request; transport failures become uniagent errors.

        `_RemoteError` (an exception raised by the server) passes through for the caller to map.
        """
        try:
            return await request
        except _RemoteError:
            raise
        except _HttpError as exc:
            if exc.status in (401, 403):
                raise SandboxError(
                    f"{what}: the SWE-ReX server at {self._url} rejected the auth token ({exc.status})"
                ) from None
            raise SandboxError(
                f"{what}: the SWE-ReX server answered {_redact(str(exc), self._token)}"
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            reason = _redact(f"{type(exc).__name__}: {exc}", self._token)
            if self._stopped or not await self._alive():
                raise SandboxDeadError(
                    f"the swerex sandbox died: the server at {self._url} does not answer ({reason})"
                ) from None
            raise SandboxError(f"{what}: request to the SWE-ReX server failed ({reason})") from None

    async def session(self, name: str = "default") -> SweRexSession:  # type: ignore[override]
        """A persistent SWE-ReX bash session; created on first use."""
        if self._stopped:
            raise SandboxDeadError("the swerex sandbox is stopped")
        async with self._session_lock:
            sess = self._rex_sessions.get(name)
            if sess is None:
                sess = SweRexSession(self, name)
                await sess.start()
                self._rex_sessions[name] = sess
        return sess

    async def _execute(self, command: str, what: str, timeout: float = 300) -> str:
        """Run a `bash -c` command outside the sessions (SWE-ReX `execute`); its stdout."""
        if not self._started or self._stopped:
            raise SandboxDeadError("the swerex sandbox is not running (start it first)")
        try:
            res: CommandResponse = await self._call(
                self._rex.execute(Command(command=["bash", "-c", command], timeout=timeout)), what
            )
        except _RemoteError as exc:
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
                await self._call(
                    self._rex.upload(UploadRequest(source_path=str(src), target_path=dest)), f"writing {dest}"
                )
            except _RemoteError as exc:
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
