"""A task's prepared base workspace, made once per process and copied into each episode.

Preparing a repository (copy it in, `git init/add/commit` a snapshot, or scrub a real
history down to its base commit and `git gc`) costs several git processes per episode, and
a thousand episodes of eighteen tasks prepared the same eighteen trees a thousand times. The
first episode of a task prepares its base inside its own sandbox, as before (git never runs
on the host against a task's repository), and the prepared tree (with its `.git`) is taken out
into a host cache; every later episode of that task gets a plain copy of it: the same files,
the same base commit sha, the same scrubbed history. For the local sandbox both copies are
host-side copies into and out of its bind-mounted workspace.

The cache lives in a temporary directory named after this process and is removed at exit;
one left by a killed process is removed by the next process that opens a cache.
`UNIAGENT_WORKSPACE_CACHE=0` turns it off.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from uniagent.sandbox import procs
from uniagent.sandbox.base import Sandbox

PREFIX = "uniagent-wscache-"


def enabled() -> bool:
    return os.environ.get("UNIAGENT_WORKSPACE_CACHE", "1") not in ("0", "false", "no", "off")


class WorkspaceCache:
    """Prepared base trees keyed by (repository path, base commit), with their base sha."""

    def __init__(self, root: Path | None = None) -> None:
        if root is None:  # caches of dead processes (a run killed with -9) are swept first
            root = procs.owned_tempdir(PREFIX)
        self.root = root
        self.entries: dict[tuple[str, str], tuple[Path, str]] = {}
        self.hits = 0
        self._locks: dict[tuple[int, tuple[str, str]], asyncio.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        """One preparation per key at a time, per event loop (an asyncio lock binds to one)."""
        with self._guard:
            return self._locks.setdefault((id(asyncio.get_running_loop()), key), asyncio.Lock())

    async def materialize(
        self, sandbox: Sandbox, src: Path, base_commit: str | None, prepare: Callable[[], Awaitable[str]]
    ) -> str:
        """Fill the sandbox's workdir with the prepared base of `src` and return its sha.

        On a miss `prepare()` runs in this sandbox (copy + git work) and its result is kept;
        on a hit the kept tree is uploaded and no git runs at all.
        """
        key = (str(src.resolve()), base_commit or "")
        async with self._lock(key):
            entry = self.entries.get(key)
            if entry is None:
                sha = await prepare()
                dest = self.root / secrets.token_hex(8)
                await sandbox.download(sandbox.workdir, dest)
                self.entries[key] = (dest, sha)
                return sha
        tree, sha = entry
        self.hits += 1
        await sandbox.upload(tree, sandbox.workdir)
        return sha

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.entries.clear()


_cache: WorkspaceCache | None = None
_cache_lock = threading.Lock()


def shared() -> WorkspaceCache:
    """This process's cache, created on first use and removed at exit."""
    global _cache
    with _cache_lock:
        if _cache is None:
            _cache = WorkspaceCache()
            atexit.register(close_shared)
        return _cache


def close_shared() -> None:
    global _cache
    with _cache_lock:
        if _cache is not None:
            with contextlib.suppress(Exception):
                _cache.close()
            _cache = None
