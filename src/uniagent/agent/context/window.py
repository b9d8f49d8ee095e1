"""`window`: keep the system and task messages and the last `keep_turns` turns; a note after the
task says how many turns were dropped (fewer turns are kept when those do not fit)."""

from __future__ import annotations

from uniagent.agent.config import ContextConfig
from uniagent.agent.context.base import Condensed, Request, cut


class WindowPolicy:
    name = "window"

    def __init__(self, config: ContextConfig) -> None:
        self.config = config
        self.dropped = 0  # turns dropped so far in this episode (the note tells the running total)

    async def condense(self, request: Request) -> Condensed | None:
        def note(dropped: int, kept: int) -> str:
            total = self.dropped + dropped
            return (
                f"[Context note: {total} earlier turn{'s' * (total != 1)} of this conversation "
                f"{'were' if total != 1 else 'was'} removed to fit the context window; the task above and "
                f"the latest {kept} turn{'s' * (kept != 1)} are kept. Continue the task.]"
            )

        out = cut(request, self.config.keep_turns, note)
        if out is not None:
            self.dropped += out.dropped_turns
        return out
