"""A persistent bash session over pipes, delimited by end markers.

bash reads NUL-terminated commands on fd 7 and runs each one in the same shell, so `cd`
and `export` persist; every command gets stdin from /dev/null, so nothing interactive can
wait for input. After each command the shell prints a random per-session marker with the
exit code and cwd. A round trip costs one pipe write and one read: no polling, no delays.

On a timeout the whole command line stops, not just the process running at that moment
(`sleep 5; echo after` must never print "after"): the shell gets SIGUSR1, which it traps to
abort the rest of the line (see `driver_script`), and its descendants get SIGINT, then
SIGKILL. The shell itself survives with its cwd and variables. A shell that is still stuck
or that died is restarted in its last working directory, and the next output says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from uniagent.errors import SandboxDeadError
from uniagent.sandbox.output import ClippedBuffer
from uniagent.sandbox.procs import quote

Spawner = Callable[[list[str]], Awaitable[asyncio.subprocess.Process]]
"""Starts argv inside the sandbox with stdin/stdout pipes (stderr may be merged or dropped)."""

TreeSignaller = Callable[["ShellSession", int], Awaitable[None]]
"""Sends a signal to every descendant of the session's shell (not to the shell)."""

ShellSignaller = Callable[["ShellSession", int], Awaitable[None]]
"""Sends a signal to the session's shell only."""

STOP_SIGNAL = signal.SIGUSR1
"""What the shell traps to abort the rest of a command line (see `driver_script`)."""

READ_CHUNK = 1 << 16


@dataclass
class ExecResult:
    """One command's outcome.

    `exit_code` is None when no exit status came back (the shell died or was restarted). After
    a timeout it is 130, as after Ctrl-C (the line's own status if it ended just as the timeout
    came), and `timed_out` is set: either way `ok` is False.
    """

    exit_code: int | None
    output: str
    timed_out: bool = False
    clipped: bool = False
    duration_s: float = 0.0
    cwd: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


SOURCE_FD = 8
"""The fd the shell sources its command loop from (see `driver_script`)."""

_LOOP = (
    # One line, so that the shell's messages about a command count lines from its first.
    "while :; do IFS= read -r -d '' __ua_cmd <&7 || { (($? > 128)) && continue; __ua_eof=1; break; }; "
    "[[ -z $__ua_stopped ]] || { trap - DEBUG; shopt -u extdebug; __ua_stopped=; }; "
    '__ua_ran=1; eval "$__ua_cmd" </dev/null; '
    'printf "$__ua_fmt" "$__ua_tok" $? "$PWD" $((__ua_ran = 0)); done'
)


def driver_script(token: str, preamble: str = "") -> str:
    """The bash program a session runs. `preamble` sets cwd, env and limits first.

    Commands run in a read-`eval`-print loop, and that loop is itself sourced (from a process
    substitution on fd 8, once at the start and again after each stop): sourced code is a
    subroutine that the shell can leave at once, from any depth of loops and functions, and
    unlike a function it keeps `declare` global. A command costs what a plain `eval` costs.

    To stop a command the session sends the shell SIGUSR1 (not SIGINT, which may be ignored
    from the start); the trap sets `extdebug` and a DEBUG trap that, while a command runs
    (`__ua_ran`), returns 2 before each further simple command inside the loop, which makes
    bash return from the sourced loop: nothing of the line runs after it. The driver then
    prints the marker (status 130) and sources the loop again. A trapped signal waits for the
    running foreground process to end; the session's SIGINT/SIGKILL to the descendants sees to
    that. The marker's `printf` clears `__ua_ran` in its own expansion, so a stop that comes
    as a line ends can never print a second marker; one that comes while the shell waits for
    the next command is cleared once that command is read. `return` in a command leaves the
    loop the same way, with its status. A command that replaces the USR1 trap gets the
    restart path. Where /dev/fd cannot be sourced, the loop runs in a plain `eval`, which
    stops only the running process on a timeout. The ready line reports the path sourced.
    """
    fd = SOURCE_FD
    return (
        "exec 7<&0 0</dev/null 2>&1\n"
        f"{preamble}\n"
        f"__ua_tok={token}\n"
        "__ua_stop() { __ua_stopped=1; shopt -s extdebug; trap __ua_skip DEBUG; }\n"
        "__ua_skip() { ((__ua_ran && ${#BASH_SOURCE[@]} > __ua_depth)) && return 2; return 0; }\n"
        "__ua_top() { __ua_depth=${#BASH_SOURCE[@]}; }\n"
        "__ua_top; __ua_stopped=; __ua_src=; __ua_eof=; __ua_ran=0; __ua_rc=0\n"
        "__ua_fmt='\\n%s %d %s\\n%.0s'\n"
        f"__ua_loop={quote(_LOOP)}\n"
        f"for __ua_p in /dev/fd/{fd} /proc/self/fd/{fd}; do\n"
        f'  ( . "$__ua_p" ) {fd}< <(echo exit 0) 2>/dev/null && {{ __ua_src=$__ua_p; break; }}\n'
        "done\n"
        "trap __ua_stop USR1\n"
        'printf "%s-ready %d %s\\n" "$__ua_tok" "$$" "$__ua_src"\n'
        "while [[ -z $__ua_eof ]]; do\n"
        '  if [[ -z $__ua_src ]]; then eval "$__ua_loop"\n'
        f'  else . "$__ua_src" {fd}< <(printf %s "$__ua_loop"); fi\n'
        "  __ua_rc=$?\n"
        "  [[ -z $__ua_stopped ]] || { __ua_rc=130; trap - DEBUG; shopt -u extdebug; __ua_stopped=; }\n"
        '  ((__ua_ran)) && printf "$__ua_fmt" "$__ua_tok" "$__ua_rc" "$PWD" $((__ua_ran = 0))\n'
        "done\n"
    )


class ShellSession:
    """One bash process inside a sandbox. Commands run one at a time (a lock serialises them)."""

    def __init__(
        self,
        spawn: Spawner,
        signal_tree: TreeSignaller,
        *,
        kill_shell: Callable[[ShellSession], Awaitable[None]] | None = None,
        signal_shell: ShellSignaller | None = None,
        name: str = "default",
        preamble: str = "",
        cwd: str | None = None,
        start_timeout_s: float = 30.0,
        interrupt_grace_s: float = 1.0,
    ) -> None:
        self.name = name
        self._spawn = spawn
        self._signal_tree = signal_tree
        self._kill_shell = kill_shell
        self._signal_shell = signal_shell
        self._preamble = preamble
        self.cwd = cwd
        self.start_timeout_s = start_timeout_s
        self.interrupt_grace_s = interrupt_grace_s
        self.token = "__UA_" + secrets.token_hex(8)
        self.proc: asyncio.subprocess.Process | None = None
        self.shell_pid: int | None = None  # as seen inside the sandbox
        self.source_path = ""  # what the shell sources each command from; "" for plain eval
        self.restarts = 0
        self._pending = bytearray()
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def argv(self) -> list[str]:
        preamble = self._preamble
        if self.cwd:
            preamble += f"\ncd -- {quote(self.cwd)} 2>/dev/null || true"
        # $0 is "bash" so error messages read as usual; the token in argv finds the process.
        return [
            "bash",
            "--noprofile",
            "--norc",
            "-c",
            driver_script(self.token, preamble),
            "bash",
            self.token,
        ]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and not self._closed

    async def start(self) -> None:
        self._pending.clear()
        try:
            self.proc = await self._spawn(self.argv)
            await asyncio.wait_for(self._read_ready(), self.start_timeout_s)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            await self._kill_proc()
            raise SandboxDeadError(f"shell session {self.name!r} did not start: {exc!r}") from exc
        except asyncio.CancelledError:
            # A half-started shell nobody holds must not outlive the cancelled start.
            await asyncio.shield(self._kill_proc())
            raise

    async def _read_ready(self) -> None:
        assert self.proc and self.proc.stdout
        line = await self.proc.stdout.readuntil(f"{self.token}-ready ".encode())
        del line
        pid, _, path = (await self.proc.stdout.readline()).decode(errors="replace").strip().partition(" ")
        self.shell_pid = int(pid)
        self.source_path = path

    async def run(
        self, command: str, timeout: float | None = None, max_output: int | None = 30_000
    ) -> ExecResult:
        async with self._lock:
            note = ""
            if not self.alive():
                if self._closed:
                    raise SandboxDeadError(f"shell session {self.name!r} is closed")
                if self.proc is not None:
                    note = self._restart_note()
                await self.start()
            result = await self._run_locked(command, timeout, max_output)
            if note:
                result.output = note + result.output
            return result

    def _restart_note(self) -> str:
        self.restarts += 1
        code = self.proc.returncode if self.proc else None
        return (
            f"[the previous shell ended (exit {code}); this command runs in a new shell in "
            f"{self.cwd or 'the start directory'}; variables set before are gone]\n"
        )

    async def _run_locked(self, command: str, timeout: float | None, max_output: int | None) -> ExecResult:
        assert self.proc and self.proc.stdin
        if "\0" in command:
            return ExecResult(2, "the command contains a NUL byte, which a shell cannot run", cwd=self.cwd)
        buf = ClippedBuffer(max_output)
        started = time.perf_counter()
        try:
            self.proc.stdin.write(command.encode() + b"\0")
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            await self._kill_proc()
            raise SandboxDeadError(f"shell session {self.name!r} is gone: {exc!r}") from exc
        state: dict[str, object] = {}
        timed_out = False
        try:
            await asyncio.wait_for(self._collect(buf, state), timeout)
        except TimeoutError:
            timed_out = True
            await self._stop_command(buf, state)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            state["eof"] = True
        duration = time.perf_counter() - started
        text = buf.text()
        if self.source_path:
            # The shell's own messages name the path it sourced the command from; they read
            # "bash: line 2: foo: command not found", with the line in the command.
            text = text.replace(f"{self.source_path}: ", "bash: ")
        if "rc" in state:
            code: int | None = int(state["rc"])  # type: ignore[call-overload]
            self.cwd = str(state.get("cwd") or self.cwd or "") or None
        else:
            code = None
        if timed_out:
            text += f"\n[the command timed out after {timeout:g}s and was interrupted]"
            if not self.alive():
                text += "\n[the shell was restarted; variables set before are gone]"
        elif state.get("eof"):
            # The shell ended by itself: let asyncio's watcher collect its status. Signalling
            # it now would make subprocess poll and reap it first, losing the exit code.
            await self._close_pipes_and_wait(2.0)
            if self.proc is not None and self.proc.returncode is None:
                await self._kill_proc()
            code = self.proc.returncode if self.proc else None
            text += "\n[the shell exited; the next command starts a new shell]"
        return ExecResult(code, text, timed_out, bool(buf.dropped), duration, self.cwd)

    async def _collect(self, buf: ClippedBuffer, state: dict[str, object]) -> None:
        """Read until the marker line; resumable after a cancellation (state lives in `buf`/`state`)."""
        assert self.proc and self.proc.stdout
        marker = f"\n{self.token} ".encode()
        keep = len(marker)
        while True:
            idx = self._pending.find(marker)
            if idx >= 0:
                end = self._pending.find(b"\n", idx + len(marker))
                if end >= 0:
                    buf.feed(bytes(self._pending[:idx]))
                    rc, _, cwd = (
                        self._pending[idx + len(marker) : end].decode(errors="replace").partition(" ")
                    )
                    state["rc"], state["cwd"] = rc, cwd
                    del self._pending[: end + 1]
                    return
            elif len(self._pending) > keep:
                buf.feed(bytes(self._pending[:-keep]))
                del self._pending[:-keep]
            chunk = await self.proc.stdout.read(READ_CHUNK)
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(self._pending), None)
            self._pending += chunk

    async def _stop_command(self, buf: ClippedBuffer, state: dict[str, object]) -> None:
        """Stop the whole line: the shell first (so that nothing after the running process
        starts), SIGINT to what the command started, then SIGKILL; restart a stuck shell."""
        await self._stop_shell()
        plan = [(signal.SIGINT, self.interrupt_grace_s)] + [(signal.SIGKILL, 0.3)] * 6
        for sig, wait in plan:
            with contextlib.suppress(Exception):
                await self._signal_tree(self, sig)
            try:
                await asyncio.wait_for(self._collect(buf, state), wait)
                return
            except TimeoutError:
                continue
            except (asyncio.IncompleteReadError, ConnectionResetError):
                break
        await self._kill_proc()

    async def _stop_shell(self) -> None:
        """Tell the shell to abort the rest of the running command line (see `driver_script`)."""
        if self._signal_shell is not None and self.source_path:
            with contextlib.suppress(Exception):
                await self._signal_shell(self, STOP_SIGNAL)

    async def interrupt(self) -> None:
        """Interrupt the running command line (from another task), as Ctrl-C would."""
        await self._stop_shell()
        await self._signal_tree(self, signal.SIGINT)

    async def _kill_proc(self, tree: bool = True) -> None:
        proc = self.proc
        if proc is None:
            return
        # What the shell started, then the shell itself (it may not be `proc`: a backend can
        # reach it through a launcher such as nsenter or `docker exec`).
        if tree:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._signal_tree(self, signal.SIGKILL), 5)
            if self._kill_shell is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._kill_shell(self), 5)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await self._close_pipes_and_wait(5.0)

    async def _close_pipes_and_wait(self, timeout: float) -> None:
        """Close our pipe ends, then wait for the process to be collected.

        A background process the command left behind may hold the other ends open for a long
        time, and `wait()` would wait for it too. (Only the pipes: closing the process
        transport would reap the child behind asyncio's watcher.)"""
        proc = self.proc
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            transport = getattr(stream, "transport", None) or getattr(stream, "_transport", None)
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), timeout)

    async def close(self, kill_tree: bool = True) -> None:
        """End the session. `kill_tree=False` when the whole sandbox is torn down anyway."""
        self._closed = True
        if self.proc is None:
            return
        # Kill first: closing stdin first would let bash exit at EOF and orphan its children
        # before the tree is walked.
        await self._kill_proc(tree=kill_tree)


def wrap_cwd_env(command: str, cwd: str | None, env: dict[str, str] | None) -> str:
    """Run `command` with a one-off cwd/env in a subshell, leaving the session's state alone."""
    if not cwd and not env:
        return command
    parts = []
    if cwd:
        parts.append(f"cd -- {quote(cwd)} || exit $?")
    for key, value in (env or {}).items():
        if not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ValueError(f"invalid environment variable name {key!r}")
        parts.append(f"export {key}={quote(value)}")
    parts.append(f"eval {quote(command)}")
    return "(" + "\n".join(parts) + "\n)"
