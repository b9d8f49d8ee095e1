"""Synchronous publish/subscribe within one process."""

from emitter.events import Emitter

__all__ = ["Emitter"]
