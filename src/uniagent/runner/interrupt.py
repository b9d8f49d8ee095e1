"""Stopping on SIGTERM / SIGINT: a cluster's preemption and a person's Ctrl-C end the same way.

Python's default for SIGTERM ends the process at once: no `finally`, no sandbox stopped, every
sandbox's processes, control directory and cgroup left on the host. Here the first signal cancels
the work instead (the caller's task), so everything unwinds through the code's own cleanup: no new
episode starts, the running ones end as cancelled (their sandboxes stopped, shielded, by the
episode's own teardown) and the caller stores them as interrupted; then `RunInterruptedError`
says how to resume, and the CLI exits 128 + the signal (143 for TERM, 130 for INT).

A second signal while that cleanup runs (a stop that hangs, an impatient person) forces the exit:
every sandbox still alive is torn down synchronously here (`Sandbox.kill_all_now`), the message is
printed, and the process leaves with the same status without waiting for anything else. What was
committed to the run store stays committed (each episode is one transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from uniagent.errors import RunInterruptedError

T = TypeVar("T")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_status(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number."""
    return 128 + signum


def resume_command(argv: list[str] | None = None, cwd: str | None = None) -> str:
    """The exact shell line that continues this invocation: changes to its working directory
    (relative paths in the arguments stay right), the same program and arguments, plus
    `--resume` unless it is there already. `python -m uniagent.cli` is written out as such."""
    argv = list(sys.argv if argv is None else argv)
    cwd = os.getcwd() if cwd is None else cwd
    prog = argv[0] if argv else "uniagent"
    if prog.endswith(".py") or prog == "-m" or not prog:  # run as `python -m uniagent.cli`
        program = [sys.executable, "-m", "uniagent.cli"]
    else:
        found = shutil.which("uniagent")
        same = found is not None and os.path.realpath(found) == os.path.realpath(prog)
        program = ["uniagent" if same else prog]
    args = argv[1:]
    if "--resume" not in args:
        args.append("--resume")
    return f"cd {shlex.quote(cwd)} && {shlex.join([*program, *args])}"


class Stopper:
    """Runs one coroutine in the current task with SIGTERM/SIGINT turned into a clean stop.

    `on_signal(signum)` runs (on the loop) at the first signal, before the task is cancelled: the
    caller's chance to note that nothing new may start. `message(signum)` is what the user reads
    (the resume command included), on a clean stop and a forced one alike.
    """

    def __init__(
        self,
        message: Callable[[int], str],
        on_signal: Callable[[int], None] | None = None,
    ) -> None:
        self.message = message
        self.on_signal = on_signal
        self.signum: int | None = None
        self._task: asyncio.Task[Any] | None = None

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        installed = self._install(loop)
        try:
            return await work
        except asyncio.CancelledError:
            if self.signum is None or self._task is None:
                raise
            self._task.uncancel()
            # The safety net: a sandbox whose stop still runs in a task the work did not wait for
            # would be cancelled mid-stop by asyncio.run's exit (the trainer's rollouts); torn
            # down here. The run's own episodes have all stopped theirs by now (none is left).
            from uniagent.sandbox.base import Sandbox

            Sandbox.kill_all_now()
            raise RunInterruptedError(self.message(self.signum), self.signum) from None
        finally:
            for sig in installed:
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)

    def _install(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        """Loop signal handlers, where they can be had: only the main thread receives signals (a
        run driven from a worker thread keeps the process's own handling)."""
        if threading.current_thread() is not threading.main_thread():
            return []
        installed = []
        for sig in SIGNALS:
            try:
                loop.add_signal_handler(sig, self._signalled, sig)
            except (RuntimeError, ValueError, NotImplementedError):
                continue
            installed.append(sig)
        return installed

    def _signalled(self, signum: int) -> None:
        if self.signum is not None:
            self.force(signum)
            return
        self.signum = signum
        if self.on_signal is not None:
            self.on_signal(signum)
        if self._task is not None:
            self._task.cancel(f"interrupted by {signal.Signals(signum).name}")

    def force(self, signum: int) -> None:
        """The second signal: tear down every live sandbox now, say how to resume, leave."""
        from uniagent.sandbox import cgroups
        from uniagent.sandbox.base import Sandbox

        first = self.signum if self.signum is not None else signum
        try:
            Sandbox.kill_all_now()
            cgroups.release_now()
        finally:
            text = f"{self.message(first)}\n(forced by a second {signal.Signals(signum).name})"
            with contextlib.suppress(Exception):
                print(text, file=sys.stderr, flush=True)
            os._exit(exit_status(first))
