"""Wait for subprocesses with pidfds on the event loop instead of a thread each (Python 3.11).

Python 3.11's default child watcher starts one thread per subprocess, blocked in waitpid: at
1,000 episodes (a sandbox and its shell sessions each) that is thousands of threads, and every
exit wakes one that must take the GIL. 3.11's own PidfdChildWatcher is bound to the one loop
it was attached to, so a second loop in another thread (a trainer's workers, tests) would
register on the wrong loop. This is Python 3.12's version: each child is watched on the loop
that spawned it. Python 3.12+ picks its pidfd watcher itself; without pidfds (Linux < 5.3)
the default stays.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class LoopPidfdWatcher(asyncio.AbstractChildWatcher):
    def add_child_handler(self, pid: int, callback: Callable[..., Any], *args: Any) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop.add_reader(pidfd, self._do_wait, loop, pid, pidfd, callback, args)

    @staticmethod
    def _do_wait(
        loop: asyncio.AbstractEventLoop, pid: int, pidfd: int, callback: Callable[..., Any], args: tuple
    ) -> None:
        loop.remove_reader(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            # Reaped by someone else. Most often the subprocess's own `Popen` did it (asyncio's
            # transport.close() polls it, and `subprocess` polls dropped Popens whenever another
            # starts): then it holds the exit code. Only a stranger's reap loses it.
            popen = getattr(args[0], "_proc", None) if args else None
            returncode = getattr(popen, "returncode", None)
            if returncode is None:
                returncode = 255
                log.warning("child process pid %d exit status already read: will report returncode 255", pid)
        else:
            returncode = os.waitstatus_to_exitcode(status)
        os.close(pidfd)
        callback(pid, returncode, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return True  # the reader goes away when the child exits

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def __enter__(self) -> LoopPidfdWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def use_pidfd_child_watcher() -> None:
    """Install `LoopPidfdWatcher` as the process's child watcher where it helps (see above)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if isinstance(asyncio.get_child_watcher(), LoopPidfdWatcher):
            return
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            return
        asyncio.set_child_watcher(LoopPidfdWatcher())
