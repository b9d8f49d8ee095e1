"""The gateway's HTTP API: OpenAI chat completions per session, and the session API around it.

- `POST /sessions` creates a session (trusted sampling, context cap, tool-call format);
- `POST /sessions/{id}/v1/chat/completions` is an OpenAI-compatible endpoint (tools, streaming),
  so any harness can use `base_url=<gateway>/sessions/{id}/v1`;
- `GET /sessions/{id}/trajectories` returns one `Trajectory.to_dict()` per segment, drift included,
  redacted: a secret's tokens replaced (`secret_redacted: true`, see `uniagent.redact`);
- `POST /sessions/{id}/finalize` (with a reward) and `POST /sessions/{id}/abort` end a session.

Every error is an OpenAI-style JSON body (`{"error": {"message", "type", "code", "param"}}`) with a
4xx status for the client's mistakes; nothing answers with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import ipaddress
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from uniagent.errors import EngineError, UniAgentError
from uniagent.models.base import Generation, TokenEngine
from uniagent.parsers.base import ToolSchemaError, normalize_tools
from uniagent.redact import Redactor, redact_logs
from uniagent.tokens import ChatCodec

from .sessions import GatewayError, Plan, Session, SessionConfig, SessionManager, Turn, clean_message

log = logging.getLogger(__name__)

# Text that opens a tool call, per format: streamed content stops there (the call goes out as tool_calls).
TOOL_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>",),
    "xml": ("<tool_call>", "<function="),
    "qwen3_coder": ("<tool_call>", "<function="),
}


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve beyond loopback without a bearer token."""
    if not token and not is_loopback(host):
        raise UniAgentError(
            f"the gateway would listen on {host!r}, reachable from other machines, without a token; "
            "pass --token (or bind to 127.0.0.1)"
        )


def _error(
    status: int, message: str, kind: str = "invalid_request_error", code: str | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status
    )


def _streams(engine: TokenEngine) -> bool:
    try:
        return "on_token" in inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):
        return False


class Gateway:
    """The app's state: engine, codec, sessions. `app` is the FastAPI application."""

    def __init__(
        self,
        engine: TokenEngine,
        codec: ChatCodec,
        *,
        parser: str = "hermes",
        token: str | None = None,
        model_name: str = "uniagent",
        idle_timeout_s: float = 1800.0,
        sweep_interval_s: float = 30.0,
        max_sessions: int = 10_000,
        redactor: Redactor | None = None,
    ) -> None:
        self.engine = engine
        self.codec = codec
        self.token = token
        # The environment's secrets (and the gateway's own token) never leave in a trajectory or a log.
        self.redactor = redactor or Redactor(extra=[token] if token else None, tokenizer=codec)
        redact_logs(self.redactor)
        self.model_name = model_name
        self.streaming = _streams(engine)
        self.sweep_interval_s = sweep_interval_s
        max_len = getattr(engine, "max_model_len", None)
        self.sessions = SessionManager(
            codec, parser, max_len if isinstance(max_len, int) else None, idle_timeout_s, max_sessions
        )
        self.app = self._build()

    # -- app ---------------------------------------------------------------------------
    def _build(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            sweeper = asyncio.create_task(self._sweep())
            try:
                yield
            finally:
                sweeper.cancel()
                for session in list(self.sessions.sessions.values()):
                    self.sessions.close(session, "aborted")

        app = FastAPI(title="uniagent gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
        self._handlers(app)
        self._routes(app)
        return app

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            n = self.sessions.expire()
            if n:
                log.info("gateway: expired %d idle sessions", n)

    def _handlers(self, app: FastAPI) -> None:
        @app.middleware("http")
        async def auth(request: Request, call_next):
            if self.token and request.url.path != "/health":
                header = request.headers.get("authorization", "")
                scheme, _, value = header.partition(" ")
                if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip(), self.token):
                    return _error(
                        401, "missing or wrong bearer token", "authentication_error", "invalid_api_key"
                    )
            return await call_next(request)

        @app.exception_handler(GatewayError)
        async def gateway_error(request: Request, exc: GatewayError):
            return _error(exc.status, str(exc), exc.kind, exc.code)

        @app.exception_handler(UniAgentError)
        async def user_error(request: Request, exc: UniAgentError):
            return _error(400, str(exc))

        @app.exception_handler(RequestValidationError)
        async def validation_error(request: Request, exc: RequestValidationError):
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return _error(400, f"invalid request: {where}: {first.get('msg', 'malformed')}")

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException):
            kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
            return _error(exc.status_code, str(exc.detail), kind)

        @app.exception_handler(Exception)
        async def internal_error(request: Request, exc: Exception):
            log.exception("gateway: unexpected error on %s", request.url.path)
            return _error(500, f"internal gateway error: {type(exc).__name__}", "server_error")

    def _routes(self, app: FastAPI) -> None:
        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"ok": True, "sessions": len(self.sessions.sessions), "streaming": self.streaming}

        @app.post("/sessions")
        async def create_session(request: Request) -> JSONResponse:
            body = await _body(request, allow_empty=True)
            try:
                config = SessionConfig.model_validate(body)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise GatewayError(f"invalid session config: {where}: {first['msg']}") from None
            session = self.sessions.create(config)
            base = str(request.base_url).rstrip("/")
            return JSONResponse(
                {**session.summary(), "base_url": f"{base}/sessions/{session.id}/v1"}, status_code=201
            )

        @app.get("/sessions")
        async def list_sessions() -> list[dict[str, Any]]:
            return [s.summary() for s in self.sessions.sessions.values()]

        @app.get("/sessions/{sid}")
        async def get_session(sid: str) -> dict[str, Any]:
            return self.sessions.get(sid).summary()

        @app.get("/sessions/{sid}/trajectories")
        async def trajectories(sid: str) -> list[dict[str, Any]]:
            session = self.sessions.get(sid)
            return await self._trajectories(session)

        @app.post("/sessions/{sid}/finalize")
        async def finalize(sid: str, request: Request) -> dict[str, Any]:
            session = self.sessions.get(sid)
            body = await _body(request, allow_empty=True)
            reward = body.get("reward")
            if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
                raise GatewayError("reward must be a number (or null)")
            details = body.get("details") or {}
            if not isinstance(details, dict):
                raise GatewayError("details must be an object")
            session.check_open()
            async with session.lock:
                session.state = "finalized"
                session.reward = None if reward is None else float(reward)
                session.reward_details = details
            trajs = await self._trajectories(session)
            return {**session.summary(), "trajectories": trajs}

        @app.post("/sessions/{sid}/abort")
        async def abort(sid: str) -> dict[str, Any]:
            session = self.sessions.get(sid)
            self.sessions.close(session, "aborted")
            return session.summary()

        @app.delete("/sessions/{sid}")
        async def delete(sid: str) -> dict[str, Any]:
            session = self.sessions.get(sid)
            self.sessions.close(session, "deleted")
            return {"session_id": sid, "deleted": True}

        @app.get("/sessions/{sid}/v1/models")
        async def models(sid: str) -> dict[str, Any]:
            self.sessions.get(sid)
            return {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "owned_by": "uniagent"}],
            }

        @app.post("/sessions/{sid}/v1/chat/completions")
        async def chat(sid: str, request: Request):
            body = await _body(request)
            return await self.chat(sid, body)

    async def _trajectories(self, session: Session) -> list[dict[str, Any]]:
        async with session.lock:
            trajs = await asyncio.to_thread(session.trajectories)
        return await asyncio.to_thread(lambda: [self._redacted(t.to_dict()) for t in trajs])

    def _redacted(self, traj: dict[str, Any]) -> dict[str, Any]:
        clean = self.redactor.trajectory(traj, self.codec)
        if clean is None:  # a secret survived token-level replacement: no ids leave at all
            empty = {"prompt_ids": [], "response_ids": [], "response_mask": [], "response_logprobs": []}
            clean = {**traj, **empty, "spans": [], "drift": 0, "secret_redacted": True}
        return clean

    # -- chat completions ----------------------------------------------------------------
    async def chat(self, sid: str, body: dict[str, Any]):
        session = self.sessions.get(sid)
        session.check_open()
        session.touch()
        messages, tools = _parse_chat(body)
        sampling = session.sampling_for(body)
        want_logprobs = bool(body.get("logprobs"))
        if not body.get("stream"):
            async with session.lock:
                session.check_open()
                plan = await _maybe_thread(_heavy(messages), session.plan, messages, tools, sampling)
                generation = await self._generate(session, plan)
                turn = await _maybe_thread(
                    len(generation.token_ids) > HEAVY_TOKENS, session.commit, plan, generation
                )
            session.touch()
            return JSONResponse(self._completion(turn, want_logprobs))
        await session.lock.acquire()
        try:
            session.check_open()
            plan = await _maybe_thread(_heavy(messages), session.plan, messages, tools, sampling)
        except BaseException:
            session.lock.release()
            raise
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        producer = asyncio.create_task(self._produce(session, plan, queue))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            self._sse(session, plan, producer, queue, include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

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
            raise GatewayError(f"the engine failed: {exc}", 503, "engine_error", "server_error") from None
        finally:
            session.inflight.discard(task)

    async def _produce(self, session: Session, plan: Plan, queue: asyncio.Queue[tuple[str, Any]]) -> None:
        """Run one streamed generation; owns the session lock (taken by `chat`) until it ends."""
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

    async def _sse(
        self,
        session: Session,
        plan: Plan,
        producer: asyncio.Task[None],
        queue: asyncio.Queue[tuple[str, Any]],
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        stops = set(plan.sampling.stop_token_ids)
        markers = TOOL_MARKERS.get(session.parser.name, ("<tool_call>",)) if plan.tools else ()

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            body = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model_name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
                **extra,
            }
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

        ids: list[int] = []
        sent = ""
        held = False  # a tool call started: the rest goes out as tool_calls at the end
        try:
            yield chunk({"role": "assistant", "content": ""})
            while True:
                kind, item = await queue.get()
                if kind == "token":
                    if item in stops:
                        continue
                    ids.append(item)
                    if held:
                        continue
                    text = (
                        await asyncio.to_thread(session.codec.decode, ids)
                        if len(ids) > 256
                        else (session.codec.decode(ids))
                    )
                    visible, held = _visible(text, markers)
                    if len(visible) > len(sent):
                        yield chunk({"content": visible[len(sent) :]})
                        sent = visible
                    continue
                if kind == "error":
                    exc: GatewayError = item
                    err = {"message": str(exc), "type": exc.kind, "param": None, "code": exc.code}
                    yield f"data: {json.dumps({'error': err})}\n\n".encode()
                    break
                turn: Turn = item
                if turn.calls:
                    deltas = [{"index": i, **c.to_openai()} for i, c in enumerate(turn.calls)]
                    yield chunk({"tool_calls": deltas})
                elif turn.content.startswith(sent) and len(turn.content) > len(sent):
                    yield chunk({"content": turn.content[len(sent) :]})
                yield chunk({}, turn.finish_reason)
                if include_usage:
                    body = {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": self.model_name,
                        "choices": [],
                        "usage": _usage(turn),
                    }
                    yield f"data: {json.dumps(body)}\n\n".encode()
                break
            yield b"data: [DONE]\n\n"
        finally:
            if not producer.done():
                producer.cancel()

    def _completion(self, turn: Turn, want_logprobs: bool) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            message["tool_calls"] = [c.to_openai() for c in turn.calls]
            message["content"] = turn.content or None
        logprobs = None
        if want_logprobs:
            decode = self.codec.decode
            logprobs = {
                "content": [
                    {"token": decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(turn.generation.token_ids, turn.generation.logprobs, strict=True)
                ]
            }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {"index": 0, "message": message, "finish_reason": turn.finish_reason, "logprobs": logprobs}
            ],
            "usage": _usage(turn),
        }


# Codec work (template render + tokenization) takes ~0.1-0.3 ms for a usual turn: less than a hop to a
# worker thread costs under load. Only big requests (long observations, a long history rendered for
# a new chain) or long generations go to a thread, so the event loop never stalls for long.
HEAVY_CHARS = 32_000
HEAVY_TOKENS = 1024


def _heavy(messages: list[dict[str, Any]]) -> bool:
    return sum(len(m["content"]) for m in messages) > HEAVY_CHARS


async def _maybe_thread(heavy: bool, fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args) if heavy else fn(*args)


def _usage(turn: Turn) -> dict[str, int]:
    n = len(turn.generation.token_ids)
    return {
        "prompt_tokens": turn.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": turn.prompt_tokens + n,
    }


def _visible(text: str, markers: tuple[str, ...]) -> tuple[str, bool]:
    """The prefix of `text` safe to stream: before any tool-call marker, without a partial marker
    or a partial UTF-8 character at its end. Also whether a marker was seen."""
    cut, seen = len(text), False
    for marker in markers:
        at = text.find(marker)
        if 0 <= at < cut:
            cut, seen = at, True
    visible = text[:cut]
    if not seen:
        for marker in markers:
            for k in range(min(len(marker) - 1, len(visible)), 0, -1):
                if visible.endswith(marker[:k]):
                    visible = visible[:-k]
                    break
    while visible.endswith("\ufffd"):
        visible = visible[:-1]
    return visible, seen


async def _body(request: Request, allow_empty: bool = False) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        if allow_empty:
            return {}
        raise GatewayError("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise GatewayError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise GatewayError("the request body must be a JSON object")
    return body


def _parse_chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError("'messages' must be a non-empty list", code="invalid_messages")
    cleaned = [clean_message(m, i) for i, m in enumerate(messages)]
    n = body.get("n")
    if n not in (None, 1):
        raise GatewayError("only n=1 is supported", code="unsupported_parameter")
    stop = body.get("stop")
    if stop:
        raise GatewayError(
            "'stop' strings are not supported: generations end at the chat template's end-of-turn",
            code="unsupported_parameter",
        )
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise GatewayError("'tools' must be a list of tool schemas")
    try:
        normalize_tools(tools)
    except ToolSchemaError as exc:
        raise GatewayError(str(exc)) from None
    if tools:
        for i, tool in enumerate(tools):
            if not isinstance(tool.get("function"), dict):
                raise GatewayError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
    return cleaned, tools or None
