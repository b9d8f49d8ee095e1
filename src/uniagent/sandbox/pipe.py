"""Backends that run bash over pipes: local (bubblewrap), host, container (docker, podman,
apptainer) and Modal.

Such a backend only says how to start a process inside it with stdin/stdout pipes (`_spawn`);
the persistent session (`ShellSession`: markers, timeouts that stop the whole command line,
restarts in the last cwd) is built on that here. How a timed-out command's process tree and a
stuck shell are signalled has a default that works anywhere a second process can be started
inside (it walks /proc in there); backends that see the processes from this machine (local,
host) do it directly.
"""

from __future__ import annotations

import asyncio
import signal
from abc import abstractmethod
from typing import ClassVar

from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.procs import tree_signal_script
from uniagent.sandbox.shell import ShellSession


class PipeShellSandbox(Sandbox):
    """A Sandbox whose sessions are `ShellSession`s over the pipes of `_spawn`ed processes."""

    kill_trees_on_stop: ClassVar[bool] = False
    """True where stopping the backend does not by itself kill every process (host)."""

    @abstractmethod
    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        """Run argv inside the sandbox with stdin/stdout pipes (stderr merged or dropped)."""

    async def _signal_tree(self, session: ShellSession, sig: int) -> None:
        """Default: a second process inside the sandbox walks /proc and signals the tree."""
        if session.shell_pid is None:
            return
        proc = await self._spawn(["sh", "-c", tree_signal_script(session.shell_pid, sig)])
        await asyncio.wait_for(proc.communicate(), 10)

    async def _signal_shell(self, session: ShellSession, sig: int) -> None:
        """Default: a second process inside the sandbox signals the session's shell."""
        if session.shell_pid is None:
            return
        proc = await self._spawn(["sh", "-c", f"kill -{int(sig)} {int(session.shell_pid)} 2>/dev/null; true"])
        await asyncio.wait_for(proc.communicate(), 10)

    async def _kill_shell(self, session: ShellSession) -> None:
        """Kill a stuck session's shell inside the sandbox: killing the local launcher
        (`docker exec`, ...) does not stop the process it started on the other side."""
        await self._signal_shell(session, signal.SIGKILL)

    async def _open_session(self, name: str) -> ShellSession:
        sess = ShellSession(
            self._spawn,
            self._signal_tree,
            kill_shell=self._kill_shell,
            signal_shell=self._signal_shell,
            name=name,
            preamble=self._preamble(),
            start_timeout_s=self.config.start_timeout_s,
        )
        await sess.start()
        return sess

    async def session(self, name: str = "default") -> ShellSession:
        sess = await super().session(name)
        assert isinstance(sess, ShellSession)
        return sess

    async def _close_sessions(self) -> None:
        for s in list(self._sessions.values()):
            assert isinstance(s, ShellSession)
            await s.close(kill_tree=self.kill_trees_on_stop)
        self._sessions.clear()
