"""Turning raw command output into something a model can read: decoded, de-ANSI'd, clipped."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """Colour codes and cursor movement mean nothing to a model and waste tokens."""
    return _ANSI.sub("", text).replace("\r\n", "\n")


class ClippedBuffer:
    """Keeps the head and the tail of a stream; counts what was dropped in between.

    Both ends matter: the head shows what started, the tail shows how it ended (tracebacks,
    test summaries). Memory stays bounded however much a command prints.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        if self.limit is None:
            self.head += data
            return
        half = self.limit // 2
        room = half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        extra = len(self.tail) - (self.limit - half)
        if extra > 0:
            self.dropped += extra
            del self.tail[:extra]

    @property
    def total(self) -> int:
        return len(self.head) + len(self.tail) + self.dropped

    def text(self) -> str:
        head = strip_ansi(self.head.decode("utf-8", errors="replace"))
        if not self.dropped:
            return head + strip_ansi(self.tail.decode("utf-8", errors="replace"))
        tail = strip_ansi(self.tail.decode("utf-8", errors="replace"))
        note = (
            f"\n[... {self.dropped} bytes of output cut here (of {self.total} in all); "
            "narrow the command, e.g. with head, tail or grep, to see them ...]\n"
        )
        return head + note + tail


def clip_text(text: str, limit: int | None) -> tuple[str, bool]:
    """Clip an already-decoded text the same way a stream is clipped."""
    buf = ClippedBuffer(limit)
    buf.feed(text.encode("utf-8", errors="replace"))
    return buf.text(), bool(buf.dropped)
