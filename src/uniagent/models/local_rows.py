"""What `LocalEngine`'s worker holds for each request, and how results reach the caller.

A `Request` is taken in on the caller's event loop and run on the engine's worker thread; a `Row` is a
request while it decodes in a `Batch`. The worker never touches a request's future: `settle` and
`emit` queue the result and each streamed token onto the request's own loop (the token first), so a
caller whose loop has closed, or who cancelled meanwhile, is simply not answered. `EngineStats` are
the counters the engine and its `BatchRunner` (`models/local_batch.py`) update in place.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from uniagent.models.base import FinishReason, Generation, SamplingParams

if TYPE_CHECKING:
    from collections.abc import Callable

    from uniagent.models.kv_prefix import Prefix


@dataclass
class EngineStats:
    """Counters a caller (or a test) can read to see how work was batched.

    `prefill_batches` counts groups of requests admitted together (one prefill forward each);
    with iteration-level joining a group joins the running batch instead of waiting for it.
    `prefill_tokens` counts prompt tokens actually run; `prefix_hits` requests that reused a kept
    prefix and `prefix_reused_tokens` the prompt tokens they did not run again.
    """

    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    prefill_batches: int = 0
    decode_steps: int = 0
    generated_tokens: int = 0
    max_rows: int = 0
    prefill_tokens: int = 0
    prefix_hits: int = 0
    prefix_reused_tokens: int = 0

    # `LocalEngine.update_weights` calls applied, and the rows they took out and resumed (partial rollout).
    weight_updates: int = 0
    interrupted: int = 0

    @property
    def in_flight(self) -> int:
        """Requests queued or running: taken in, not yet completed, failed or cancelled."""
        return self.requests - self.completed - self.failed - self.cancelled


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    request_id: str
    stop_ids: frozenset[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    # Set on the event-loop thread when the awaiting coroutine is cancelled; the worker only reads it.
    cancelled: bool = False
    # Called on the request's event loop with (token_id, logprob) as each token is sampled (streaming).
    on_token: Callable[[int, float], None] | None = None
    # Set by the worker at admission: the kept prefix this request took over and how much of it it reuses.
    prefix: Prefix | None = None
    reused: int = 0
    # Partial rollout (`BatchRunner.interrupt`): what earlier runs of this request sampled before a weight
    # update took it out (the final Generation starts with them), and its sampling stream, kept so that a
    # resumed request draws where it stopped.
    carried_ids: list[int] = field(default_factory=list)
    carried_logprobs: list[float] = field(default_factory=list)
    carried_versions: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None

    @property
    def budget(self) -> int:
        """Worst-case tokens this request holds in the cache; what admission control adds up."""
        return len(self.prompt_ids) + self.sampling.max_tokens


@dataclass(eq=False)
class Row:
    request: Request
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: FinishReason | None = None

    def result(self, finish: FinishReason) -> Generation:
        """The request's whole generation: tokens carried from interrupted runs, then this row's."""
        r = self.request
        return Generation(
            r.carried_ids + self.token_ids,
            r.carried_logprobs + self.logprobs,
            finish,
            r.carried_versions + self.versions,
        )


@dataclass(eq=False)
class Batch:
    """Rows decoded together and their shared cache. `mask` ([rows, cache_len], real slots) is kept here
    only for a `DynamicCache` (models `SlotCache` cannot serve); a `SlotCache` holds its own."""

    rows: list[Row]
    cache: Any
    mask: torch.Tensor | None = None

    @property
    def budget(self) -> int:
        return sum(row.request.budget for row in self.rows)


def emit(request: Request, token: int, logprob: float) -> None:
    """Stream one token to the request's event loop (queued before its settle, so it arrives first)."""
    callback = request.on_token
    assert callback is not None

    def deliver() -> None:
        if not request.future.done():
            callback(token, logprob)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed
        request.loop.call_soon_threadsafe(deliver)


def settle(request: Request, outcome: Generation | BaseException) -> None:
    """Hand a result to the request's event loop; the worker must never touch the future directly."""

    def resolve() -> None:
        if request.future.done():  # cancelled by the caller meanwhile
            return
        if isinstance(outcome, BaseException):
            request.future.set_exception(outcome)
        else:
            request.future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is waiting any more
        request.loop.call_soon_threadsafe(resolve)
