"""One SWE-ReX bash session as a uniagent `Session` (the protocol is described in
sandbox/swerex.py's docstring): commands travel as one `eval $'…'` line between markers that
carry the exit code and the cwd; timeouts interrupt, lost shells are replaced in their cwd.

A session knows its sandbox only as a `SessionServer`: the server's client and the call that turns
transport failures into uniagent errors; what a new shell runs first is given when it is made."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    CreateBashSessionRequest,
)

from uniagent.errors import SandboxDeadError, SandboxError
from uniagent.sandbox.output import clip_text
from uniagent.sandbox.procs import quote
from uniagent.sandbox.shell import ExecResult
from uniagent.sandbox.swerex_client import Client, RemoteError

_SESSION_SETUP = "set +H; export PAGER=cat GIT_PAGER=cat MANPAGER=cat SYSTEMD_PAGER=cat"
"""A pty makes programs think a human is watching: pagers would wait for a key forever."""


def _ansi_c(command: str) -> str:
    """`command` as one bash `$'…'` word of printable ASCII (see the module docstring)."""
    out = []
    for b in command.encode():
        if 0x20 <= b < 0x7F and b not in (0x27, 0x5C, 0x21):  # ' \ ! are escaped too
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


class SessionServer(Protocol):
    """What a session uses of its sandbox (`SweRexSandbox`)."""

    @property
    def rex(self) -> Client:
        """The server's client (raises `SandboxDeadError` once the sandbox is stopped)."""
        ...

    async def call(self, request: Awaitable[Any], what: str) -> Any:
        """Await one request; transport failures become uniagent errors, a `RemoteError` passes."""
        ...


class SweRexSession:
    """One SWE-ReX bash session. Commands run one at a time (a lock serialises them).

    The SWE-ReX server runs every command on its event loop, so commands in different
    sessions of one server also run one after the other; their state stays separate.
    """

    def __init__(
        self, server: SessionServer, name: str, *, prefix: str, setup: str, start_timeout_s: float
    ) -> None:
        """`prefix` makes the server-side session names unique to this sandbox; `setup` is what a
        new shell runs first (the workdir, PATH, env); `start_timeout_s` bounds a shell's start."""
        self.server = server
        self.name = name
        self.prefix = prefix
        self.setup = setup
        self.start_timeout_s = start_timeout_s
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
        return f"{self.prefix}-{self.name}-{self._generation}"

    def alive(self) -> bool:
        return self._open and not self._closed

    async def start(self) -> None:
        """Create the bash session on the server and set PATH, env and cwd in it."""
        server = self.server
        await server.call(
            server.rex.create_session(
                CreateBashSessionRequest(
                    session=self.remote_name, startup_timeout=min(self.start_timeout_s, 30.0)
                )
            ),
            f"creating session {self.name!r}",
        )
        self._open = True
        setup = f"{_SESSION_SETUP}\n{self.setup}"
        if self.cwd:
            setup += f"\ncd -- {quote(self.cwd)} 2>/dev/null || true"
        res = await self._run_once(setup, self.start_timeout_s, None)
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
        self._seq += 1
        tag = f"{self.token}-{self._seq}"
        line = (
            f"printf '%s\\n' {tag}-start; eval {_ansi_c(command)} </dev/null; __ua_rc=$?; "
            f'printf \'\\n%s %d %s\\n\' {tag} "$__ua_rc" "$PWD"'
        )
        action = BashAction(command=line, session=self.remote_name, timeout=timeout, check="ignore")
        started = time.perf_counter()
        try:
            obs = await self.server.call(self.server.rex.run_in_session(action), "running a command")
        except RemoteError as exc:
            return await self._failed(exc, tag, timeout, max_output, started)
        body, code, cwd = self._parse(obs.output, tag)
        if cwd:
            self.cwd = cwd
        text, clipped = clip_text(body, max_output)
        return ExecResult(code, text, False, clipped, time.perf_counter() - started, self.cwd)

    async def _failed(
        self, exc: RemoteError, tag: str, timeout: float, max_output: int | None, started: float
    ) -> ExecResult:
        """Map a server-side exception of a command: a timeout, a dead shell, or an error."""
        server = self.server
        if exc.name == "CommandTimeoutError":
            partial = ""
            try:
                obs = await server.call(
                    server.rex.run_in_session(
                        BashInterruptAction(session=self.remote_name, timeout=1.0, n_retry=3)
                    ),
                    "interrupting a command",
                )
                partial = self._parse(obs.output, tag)[0]
                lost = False
            except RemoteError:
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
            await self.server.call(
                self.server.rex.close_session(CloseBashSessionRequest(session=self.remote_name)),
                "closing a session",
            )

    async def interrupt(self) -> None:
        """Ctrl-C whatever runs now. The server handles one request at a time, so this takes
        effect once the running request returns; a command's own timeout is the way to stop it."""
        await self.server.call(
            self.server.rex.run_in_session(BashInterruptAction(session=self.remote_name)), "interrupting"
        )

    async def close(self) -> None:
        self._closed = True
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.server.rex.close_session(CloseBashSessionRequest(session=self.remote_name)), 10
                )
