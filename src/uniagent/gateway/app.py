"""The gateway's HTTP API: per-session model endpoints in several wire protocols, and the session
API around them.

- `POST /sessions` creates a session (trusted sampling, context cap, tool-call format);
- per session, one endpoint per wire protocol (`gateway.wire.PROTOCOLS`), all over the same token
  conversation: OpenAI chat completions (`/sessions/{id}/v1/chat/completions`, any OpenAI client,
  mini-swe-agent), Anthropic Messages (`/sessions/{id}/v1/messages` and its `count_tokens`, Claude
  Code) and OpenAI Responses (`/sessions/{id}/v1/responses`, Codex). `HEAD /sessions/{id}` answers
  the probe Claude Code sends at start;
- `GET /sessions/{id}/trajectories` returns one `Trajectory.to_dict()` per segment, drift included,
  redacted: a secret's tokens replaced (`secret_redacted: true`, see `uniagent.redact`);
- `POST /sessions/{id}/finalize` (with a reward) and `POST /sessions/{id}/abort` end a session.

The gateway's token is taken as a bearer token or as `x-api-key` (what Anthropic clients send).
Every error is a JSON body in the shape of the protocol its path belongs to (OpenAI's for the
session API) with a 4xx status for the client's mistakes; nothing answers with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from uniagent.config import first_error
from uniagent.errors import UniAgentError
from uniagent.models.base import TokenEngine
from uniagent.redact import Redactor, redact_logs
from uniagent.tokens import ChatCodec

from .calls import ModelCalls
from .sessions import GatewayError, Session, SessionConfig, SessionManager
from .wire import PROTOCOLS, Wire, wire_for

log = logging.getLogger(__name__)


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


def _error(path: str, exc: GatewayError) -> JSONResponse:
    return JSONResponse(wire_for(path).error(exc), status_code=exc.status)


def _presented_token(request: Request) -> str:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    return request.headers.get("x-api-key", "").strip()


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
        self.calls = ModelCalls(engine, model_name)
        self.streaming = self.calls.streaming
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
        for wire in PROTOCOLS:
            self._protocol_routes(app, wire)
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
            path = request.url.path
            token = _presented_token(request)
            if self.token and path != "/health" and not hmac.compare_digest(token, self.token):
                exc = GatewayError("missing or wrong token", 401, "invalid_api_key", "authentication_error")
                return _error(path, exc)
            return await call_next(request)

        @app.exception_handler(GatewayError)
        async def gateway_error(request: Request, exc: GatewayError):
            return _error(request.url.path, exc)

        @app.exception_handler(UniAgentError)
        async def user_error(request: Request, exc: UniAgentError):
            return _error(request.url.path, GatewayError(str(exc)))

        @app.exception_handler(RequestValidationError)
        async def validation_error(request: Request, exc: RequestValidationError):
            message = f"invalid request: {first_error(exc) if exc.errors() else 'malformed'}"
            return _error(request.url.path, GatewayError(message))

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException):
            kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
            return _error(request.url.path, GatewayError(str(exc.detail), exc.status_code, kind=kind))

        @app.exception_handler(Exception)
        async def internal_error(request: Request, exc: Exception):
            log.exception("gateway: unexpected error on %s", request.url.path)
            error = GatewayError(f"internal gateway error: {type(exc).__name__}", 500, kind="server_error")
            return _error(request.url.path, error)

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
                raise GatewayError(f"invalid session config: {first_error(exc)}") from None
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

        @app.head("/sessions/{sid}")
        async def probe(sid: str) -> Response:  # Claude Code's HEAD of its base URL at start
            self.sessions.get(sid)
            return Response(status_code=200)

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

    def _protocol_routes(self, app: FastAPI, wire: Wire) -> None:
        """A protocol's generation endpoint (the query string, like Claude Code's `?beta=true`,
        is ignored) and its token count where it has one."""

        async def generate(sid: str, request: Request) -> Response:
            return await self.calls.serve(wire, self.sessions.get(sid), await _body(request))

        app.add_api_route(f"/sessions/{{sid}}{wire.path}", generate, methods=["POST"], name=wire.name)
        if wire.count_path:

            async def count(sid: str, request: Request) -> JSONResponse:
                return await self.calls.count(wire, self.sessions.get(sid), await _body(request))

            app.add_api_route(f"/sessions/{{sid}}{wire.count_path}", count, methods=["POST"])

    async def _trajectories(self, session: Session) -> list[dict[str, Any]]:
        async with session.lock:
            trajs = await asyncio.to_thread(session.trajectories)
        return await asyncio.to_thread(lambda: [self._redacted(t.to_dict()) for t in trajs])

    def _redacted(self, traj: dict[str, Any]) -> dict[str, Any]:
        clean = self.redactor.trajectory(traj, self.codec)
        if clean is None:  # a secret survived token-level replacement: no ids leave at all
            keys = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "response_versions")
            empty: dict[str, Any] = {k: [] for k in keys}
            clean = {**traj, **empty, "spans": [], "drift": 0, "secret_redacted": True}
        return clean


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
