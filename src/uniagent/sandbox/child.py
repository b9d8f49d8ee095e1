"""Start child processes off the event loop's thread, then drive them with asyncio streams.

Why: `asyncio.create_subprocess_exec` forks and execs on the loop's thread, and that fork is a
vfork: the caller sleeps (state D) until the child has exec'd. On a loaded machine the child
waits for a core before it gets there. Measured at 1,000 episodes on 2 cores (bench/runner.py's
stall probe): 78 % of the loop's stalls over 100 ms were inside `subprocess._execute_child`,
up to 9.6 s each. Here `subprocess.Popen` runs on a small thread pool (CPython releases the GIL
for that wait, gh-104372), and only then are the child's pipes connected to the loop, with the
public `connect_read_pipe` / `connect_write_pipe`; its exit is watched with a pidfd on the loop.

`Child` offers what `asyncio.subprocess.Process` offers and this project uses, so callers do not
change: `pid`, `returncode`, `stdin` (StreamWriter), `stdout`/`stderr` (StreamReader), `wait()`,
`communicate()`, `kill()`/`terminate()`/`send_signal()`, and `_transport` with
`get_pipe_transport(fd)` and `close()` (procs.kill_process closes a child's pipes through it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

STREAM_LIMIT = 2**16  # asyncio's default for subprocess streams
SPAWN_THREADS = 8
"""Spawns in flight at once. Each thread mostly sleeps in the kernel until its child has exec'd,
so a few more than the cores keep a burst of sandbox starts from queueing behind one slow exec."""

_pool: list[ThreadPoolExecutor] = []


def _executor() -> ThreadPoolExecutor:
    if not _pool:
        _pool.append(ThreadPoolExecutor(SPAWN_THREADS, thread_name_prefix="uniagent-spawn"))
    return _pool[0]


class _WriteProtocol(asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """A stdin pipe's protocol: the flow control `StreamWriter.drain()` needs, nothing else."""


class _Pipes:
    """Stands where asyncio's subprocess transport stands: the pipe transports by fd, and a
    `close()` that closes them and kills the child if it still runs (as asyncio's does)."""

    def __init__(self, child: Child) -> None:
        self._child = child
        self.pipes: dict[int, asyncio.BaseTransport] = {}

    def get_pipe_transport(self, fd: int) -> asyncio.BaseTransport | None:
        return self.pipes.get(fd)

    def close(self) -> None:
        for transport in self.pipes.values():
            with contextlib.suppress(Exception):
                transport.close()
        if self._child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._child.kill()


class Child:
    """An asyncio view of a `subprocess.Popen` (see the module docstring)."""

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.returncode: int | None = None
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self._transport = _Pipes(self)

    async def _connect(self, limit: int) -> None:
        loop, popen = self._loop, self.popen
        if popen.stdin is not None:
            transport, protocol = await loop.connect_write_pipe(lambda: _WriteProtocol(loop), popen.stdin)
            self._transport.pipes[0] = transport
            self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        for fd, pipe in ((1, popen.stdout), (2, popen.stderr)):
            if pipe is None:
                continue
            reader = asyncio.StreamReader(limit=limit, loop=loop)
            transport, _ = await loop.connect_read_pipe(
                lambda reader=reader: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
            )
            self._transport.pipes[fd] = transport
            if fd == 1:
                self.stdout = reader
            else:
                self.stderr = reader
        self._watch_exit()

    def _watch_exit(self) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfds (Linux < 5.3): a pool thread waits instead
            waiting = self._loop.run_in_executor(None, self.popen.wait)
            waiting.add_done_callback(lambda f: self._set_exit(f.result()))
            return

        def exited() -> None:
            self._loop.remove_reader(pidfd)
            os.close(pidfd)
            self._set_exit(self.popen.wait())  # a pidfd is readable once the child has exited

        self._loop.add_reader(pidfd, exited)

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        if not self._exited.done():
            self._exited.set_result(code)

    async def wait(self) -> int:
        """The exit code, once the child has exited (a cancelled caller leaves the watch alone)."""
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        self.popen.send_signal(sig)  # polls first: never a signal to a reaped (reused) pid

    def kill(self) -> None:
        self.send_signal(9)

    def terminate(self) -> None:
        self.send_signal(15)

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        """Write `input`, close stdin, read stdout and stderr to EOF, wait for the exit."""
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    await self.stdin.drain()
            self.stdin.close()

        async def read(stream: asyncio.StreamReader | None) -> bytes | None:
            return None if stream is None else await stream.read()

        out, err = await asyncio.gather(read(self.stdout), read(self.stderr))
        await self.wait()
        return out, err


async def start_child(*argv: str, limit: int = STREAM_LIMIT, **kwargs: Any) -> Child:
    """`asyncio.create_subprocess_exec(*argv, **kwargs)` with the fork and exec on a pool thread.

    Not cancellation-safe on its own (a cancelled caller would leave the child running):
    `procs.spawn` shields it and kills what a cancelled start made."""
    loop = asyncio.get_running_loop()
    popen = await loop.run_in_executor(
        _executor(), functools.partial(subprocess.Popen, list(argv), bufsize=0, **kwargs)
    )
    child = Child(popen, loop)
    try:
        await child._connect(limit)
    except BaseException:
        child._transport.close()
        raise
    return child
