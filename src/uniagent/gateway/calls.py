"""One model call through a gateway session, in any wire protocol.

`ModelCalls.serve` is the whole path of a request: the wire parses it, the session plans it on its
token conversation (extend, roll back or a new segment; trusted sampling; the context cap), the
engine generates, the session commits the turn, and the wire writes the answer (a JSON body, or
its event stream as tokens arrive). Only state changes on success: a request that goes away
mid-generation leaves the record as it was and counts the engine's tokens as dropped.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from uniagent.errors import EngineError
from uniagent.models.base import Generation, SamplingParams, TokenEngine
from uniagent.parsers.stream import call_markers, visible_prefix

from .sessions import GatewayError, Plan, Session
from .wire import Event, Exchange, Wire, WireRequest

log = logging.getLogger(__name__)


def _streams(engine: TokenEngine) -> bool:
    try:
        return "on_token" in inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):
        return False


class ModelCalls:
    """The engine side of a gateway: one generation per request, streamed when the engine can."""

    def __init__(self, engine: TokenEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.streaming = _streams(engine)

    async def serve(self, wire: Wire, session: Session, body: dict[str, Any]) -> Response:
        """Parse `body` with `wire`, plan it on the session's conversation, generate, commit, and
        answer in the wire's shape (a JSON body, or its event stream)."""
        session.check_open()
        session.touch()
        req = wire.parse(body)
        sampling = self._sampling(session, wire, req)
        heavy = _heavy(req.messages)
        if not req.stream:
            async with session.lock:
                session.check_open()
                plan = await _maybe_thread(heavy, session.plan, req.messages, req.tools, sampling)
                generation = await self._generate(session, plan)
                turn = await _maybe_thread(
                    len(generation.token_ids) > HEAVY_TOKENS, session.commit, plan, generation
                )
            session.touch()
            return JSONResponse(wire.response(turn, self._exchange(session, req, plan)))
        await session.lock.acquire()
        try:
            session.check_open()
            plan = await _maybe_thread(heavy, session.plan, req.messages, req.tools, sampling)
        except BaseException:
            session.lock.release()
            raise
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        producer = asyncio.create_task(self._produce(session, plan, queue))

        async def body_stream() -> AsyncIterator[bytes]:
            events = self._events(session, plan, queue)
            try:
                async for chunk in wire.stream(events, self._exchange(session, req, plan)):
                    yield chunk
            finally:  # the client went away, or the stream ended: the generation ends with it
                if not producer.done():
                    producer.cancel()
                await events.aclose()

        headers = {"Cache-Control": "no-cache"}
        return StreamingResponse(body_stream(), media_type="text/event-stream", headers=headers)

    async def count(self, wire: Wire, session: Session, body: dict[str, Any]) -> JSONResponse:
        """The tokens a request's prompt takes, without generating (Anthropic's count_tokens)."""
        req = wire.parse(body)
        tokens = await _maybe_thread(_heavy(req.messages), session.count_tokens, req.messages, req.tools)
        return JSONResponse(wire.count(tokens))

    def _sampling(self, session: Session, wire: Wire, req: WireRequest) -> SamplingParams:
        sampling = session.sampling_for(req.sampling)
        ceiling = session.sampling.max_tokens
        if wire.clamp_max_tokens and sampling.max_tokens > ceiling:
            sampling = sampling.model_copy(update={"max_tokens": ceiling})
        return sampling

    def _exchange(self, session: Session, req: WireRequest, plan: Plan) -> Exchange:
        return Exchange(self.model_name, len(plan.prompt_ids), req, session.codec.decode)

    async def _generate(self, session: Session, plan: Plan, on_token=None) -> Generation:
        seen = 0  # tokens a streaming engine reported: counted as dropped if the request goes away

        def count(token: int, logprob: float) -> None:
            nonlocal seen
            seen += 1
            if on_token is not None:
                on_token(token, logprob)

        if self.streaming:
            coro = self.engine.generate(plan.prompt_ids, plan.sampling, session.request_id, on_token=count)
        else:
            coro = self.engine.generate(plan.prompt_ids, plan.sampling, session.request_id)
        task = asyncio.ensure_future(coro)
        session.inflight.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            session.dropped(seen)
            current = asyncio.current_task()
            if task.cancelled() and not (current and current.cancelling()):
                raise GatewayError(
                    f"session {session.id!r} was {session.state}", 404, "session_closed"
                ) from None
            raise
        except EngineError as exc:
            session.engine_errors += 1
            raise GatewayError(f"the engine failed: {exc}", 503, "engine_error", "server_error") from None
        finally:
            session.inflight.discard(task)

    async def _produce(self, session: Session, plan: Plan, queue: asyncio.Queue[tuple[str, Any]]) -> None:
        """Run one streamed generation; owns the session lock (taken by `serve`) until it ends."""
        try:
            on_token = (lambda t, lp: queue.put_nowait(("token", t))) if self.streaming else None
            generation = await self._generate(session, plan, on_token)
            if not self.streaming:  # the engine gives the whole generation at once: one chunk, honestly
                for t in generation.token_ids:
                    queue.put_nowait(("token", t))
            turn = await _maybe_thread(
                len(generation.token_ids) > HEAVY_TOKENS, session.commit, plan, generation
            )
            session.touch()
            queue.put_nowait(("done", turn))
        except asyncio.CancelledError:
            queue.put_nowait(("error", GatewayError("the request was cancelled", 499, "cancelled")))
            raise
        except GatewayError as exc:
            queue.put_nowait(("error", exc))
        except Exception as exc:
            log.exception("gateway: streamed generation failed")
            queue.put_nowait(("error", GatewayError(f"internal gateway error: {type(exc).__name__}", 500)))
        finally:
            session.lock.release()

    async def _events(
        self, session: Session, plan: Plan, queue: asyncio.Queue[tuple[str, Any]]
    ) -> AsyncIterator[Event]:
        """The generation as the wires stream it: visible text as it grows (never a tool call's
        raw text: that goes out as a structured call once the turn is parsed), then the turn."""
        stops = set(plan.sampling.stop_token_ids)
        markers = call_markers(session.parser) if plan.tools else ()
        ids: list[int] = []
        sent = ""
        held = False  # a tool call started: the rest goes out with the turn
        while True:
            kind, item = await queue.get()
            if kind != "token":
                yield kind, item
                return
            if item in stops:
                continue
            ids.append(item)
            if held:
                continue
            decode = session.codec.decode
            text = await asyncio.to_thread(decode, ids) if len(ids) > 256 else decode(ids)
            answer = session.codec.reply_format.answer_so_far(text)
            visible, held = visible_prefix(answer, markers)
            if len(visible) > len(sent):
                yield "text", visible[len(sent) :]
                sent = visible


# Codec work (template render + tokenization) takes ~0.1-0.3 ms for a usual turn: less than a hop to a
# worker thread costs under load. Only big requests (long observations, a long history rendered for
# a new chain) or long generations go to a thread, so the event loop never stalls for long.
HEAVY_CHARS = 32_000
HEAVY_TOKENS = 1024


def _heavy(messages: list[dict[str, Any]]) -> bool:
    return sum(len(m["content"]) for m in messages) > HEAVY_CHARS


async def _maybe_thread(heavy: bool, fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args) if heavy else fn(*args)
