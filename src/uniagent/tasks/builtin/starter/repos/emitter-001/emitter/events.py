"""A minimal event emitter.

Handlers run synchronously, in the order they were registered.  A handler
registered with :meth:`Emitter.once` runs at most once.  Handlers may add or
remove handlers (including themselves) while an event is being emitted; such
changes take effect from the next :meth:`Emitter.emit` call, so every handler
that was registered when ``emit`` started is called exactly once, unless it was
removed by an earlier handler of the same ``emit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Handler = Callable[..., Any]


@dataclass(eq=False)
class _Registration:
    callback: Handler
    once: bool


class Emitter:
    def __init__(self) -> None:
        self._handlers: dict[str, list[_Registration]] = {}

    def on(self, event: str, callback: Handler) -> Handler:
        """Call ``callback`` every time ``event`` is emitted.  Returns ``callback``."""
        self._handlers.setdefault(event, []).append(_Registration(callback, once=False))
        return callback

    def once(self, event: str, callback: Handler) -> Handler:
        """Call ``callback`` the next time ``event`` is emitted only."""
        self._handlers.setdefault(event, []).append(_Registration(callback, once=True))
        return callback

    def off(self, event: str, callback: Handler | None = None) -> int:
        """Remove ``callback`` (or every handler) for ``event``; return how many were removed."""
        registrations = self._handlers.get(event, [])
        keep = [] if callback is None else [r for r in registrations if r.callback != callback]
        removed = len(registrations) - len(keep)
        registrations[:] = keep
        return removed

    def listeners(self, event: str) -> list[Handler]:
        return [r.callback for r in self._handlers.get(event, [])]

    def emit(self, event: str, *args: Any, **kwargs: Any) -> int:
        """Call the handlers of ``event``; return how many were called."""
        registrations = self._handlers.get(event, [])
        called = 0
        for registration in registrations:
            if registration.once:
                registrations.remove(registration)
            registration.callback(*args, **kwargs)
            called += 1
        return called
