"""JSON for stored and exported rows: orjson where it gives the same document, `json` otherwise.

Why: an episode row carries its token ids, masks and logprobs (tens of thousands of numbers), and
the run store writes it once and the export writes it again: with `json` that was the largest item
left in the runner's profile at the end of a run (13 % of its CPU at 100 episodes). orjson writes
the same JSON about ten times faster. What it writes differently is handled here, so the stored
bytes keep one meaning: a non-finite float (a -inf logprob) would become `null` there, so such a
value goes through `json` (`-Infinity`, as before); a type orjson refuses goes through `json` too.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


def _non_finite(obj: Any) -> bool:
    """Whether `obj` holds a NaN or infinite float anywhere (sums of number lists in C)."""
    if isinstance(obj, float):
        return not math.isfinite(obj)
    if isinstance(obj, dict):
        return any(_non_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        try:
            return not math.isfinite(sum(obj))  # an overflow only sends it the slow way
        except TypeError:
            return any(_non_finite(v) for v in obj)
    return False


def dumps(obj: Any) -> str:
    """`json.dumps(obj, ensure_ascii=False)`'s document (compact), fast."""
    try:
        out = orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(obj, ensure_ascii=False)
    if b"null" in out and _non_finite(obj):
        return json.dumps(obj, ensure_ascii=False)
    return out.decode()


def loads(text: str | bytes) -> Any:
    """`json.loads`, fast; documents `json` wrote with NaN or Infinity still load."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], suffix: str = ".tmp") -> Iterator[Path]:
    """A fresh path beside `path` for the caller to write to (a file, a link, a database); when the
    block ends it is renamed over `path`, so a reader sees the old file or the new one, never a
    part; when the block raises it is removed. The parent folder is made when missing.

    Why one helper: every writer of a file that something may read at the same moment (a run
    store, metrics, a checkpoint, an index, a cached binary) needs this dance, and the copies of it
    had drifted (some left their temporary behind on failure). The path is not created here, so
    the writer's own open gives the file its usual mode, and `suffix` keeps a type-sniffing
    writer happy (matplotlib picks the format from it)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically (`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """`obj` as indented JSON at `path`, atomically (`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
