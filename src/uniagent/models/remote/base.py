"""`RemoteEngine`: a `TokenEngine` over one or more inference-server replicas that take and return token ids.

What every server shares lives here; what differs (paths, request body, response fields, abort call,
logprob semantics) is a `Dialect`, one small class per server (`vllm.py`, `sglang.py`, `llamacpp.py`).

Rules, and why:

- **Sticky routing.** All turns of one `request_id` (one episode) go to the same replica, so that
  replica's prefix cache holds the episode's history. A new request id is placed by rendezvous
  hashing over the healthy replicas (every process with the same replica list picks the same one,
  no coordination); the choice is remembered (bounded LRU), so an episode moved off a dead replica
  stays where its cache now is when the dead one comes back.
- **Health.** A replica that refuses connections, drops one mid-request or fails its probe is marked
  unhealthy and skipped; it is probed again (the dialect's health path) in the background every
  `remote.health_interval_s`. When no replica is healthy, all are probed at once before giving up.
- **Safe retries.** A retry must never produce a second, different completion for a turn: a completion
  the server may have started is never retried, because the retry's sample would be conditioned on
  the first attempt having failed (long or slow generations fail more often), which biases the data a
  trainer sees, and the first attempt may still be running. So only what the server cannot have
  started is retried: a connection that could not be opened or written (refused, connect timeout,
  the request body not fully sent) or an HTTP 503 (the server refused it as overloaded). Everything
  else after the request was sent (read error, dropped connection, 5xx, timeout) is an `EngineError`.
  Retries are bounded (`model.max_retries`), with doubling jittered backoff (`remote.backoff_s`), and
  all inside the one `model.timeout_s` deadline. A connect failure also re-routes to a healthy replica.
- **Cancellation and timeouts.** A cancelled or timed-out `generate()` closes its connection (httpx
  drops a connection whose exchange did not finish), which vLLM and llama-server take as the abort;
  servers with an abort call (SGLang `/abort_request`) also get it, in the background.
- **Errors.** Every failure is an `EngineError` naming the replica URL, the request and the reason, so
  the episode ends `model_error` (not trainable). An answer without token ids or logprobs, with
  lengths that differ, or longer than `max_tokens` is an error too: never a guessed trajectory.
- **Overhead.** One shared `httpx.AsyncClient` (pooled keep-alive connections, per event loop), the
  body serialized once per request, no pydantic on the hot path.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import math
import os
import random
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import httpx

from uniagent.errors import ConfigError, EngineError
from uniagent.models.base import FinishReason, Generation, SamplingParams
from uniagent.models.remote.config import RemoteConfig

if TYPE_CHECKING:
    from collections.abc import Sequence

    from uniagent.models.config import ModelConfig

log = logging.getLogger(__name__)

LogprobKind = Literal["raw", "after_temperature"]
_STICKY_CAPACITY = 100_000
_BACKOFF_CAP_S = 5.0
# Errors raised before the server can have read the whole request: safe to retry (see the docstring).
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError, httpx.WriteTimeout)


class Dialect(ABC):
    """How one server kind speaks. Subclasses set the class attributes and the two conversions.

    - `generate_path`, `health_path`: paths appended to a replica's base URL.
    - `logprobs`: what the server's logprob of a sampled token is. "raw": the model's log-softmax at
      temperature 1, before top-k/top-p (what the trainer recomputes; what `LocalEngine` returns);
      "after_temperature": log-softmax of logits / temperature (equal to raw at temperature 1). The
      module docstring cites where the server computes it.
    - `request(prompt_ids, sampling, call_id)`: the JSON body. `call_id` is unique per call (one turn)
      and is what `abort` names; the stop ids must stop generation with the stop token kept in the
      returned ids (`TokenChatModel` reads the end of turn from it).
    - `response(data, sampling)`: the server's JSON -> `Generation` (use `generation()` below). Raise
      `ValueError`/`KeyError`/`TypeError` on anything unexpected; the engine turns it into an
      `EngineError` naming the replica.
    - `abort(call_id)`: `(path, body)` of the server's abort call, or None when closing the
      connection aborts the request (the engine closes it anyway).
    - `unhealthy(response)`: None when a health answer says the replica can serve, else why not.
    """

    name: ClassVar[str]
    generate_path: ClassVar[str]
    health_path: ClassVar[str] = "/health"
    logprobs: ClassVar[LogprobKind]

    @classmethod
    def from_config(cls, config: ModelConfig) -> Dialect:
        """Build from the run's model config (e.g. the model name a server wants)."""
        return cls()

    @abstractmethod
    def request(self, prompt_ids: list[int], sampling: SamplingParams, call_id: str) -> dict[str, Any]: ...

    @abstractmethod
    def response(self, data: Any, sampling: SamplingParams) -> Generation: ...

    def abort(self, call_id: str) -> tuple[str, dict[str, Any]] | None:
        return None

    def unhealthy(self, response: httpx.Response) -> str | None:
        if response.status_code == 200:
            return None
        return f"health check {self.health_path} answered HTTP {response.status_code}"


def generation(token_ids: Any, logprobs: Any, finish_reason: Any) -> Generation:
    """A `Generation` from a server's fields, checked: ints, finite floats, equal lengths, a known reason."""
    if not isinstance(token_ids, list) or not all(type(t) is int and t >= 0 for t in token_ids):
        raise ValueError(f"token ids are not a list of non-negative ints: {str(token_ids)[:80]}")
    if not isinstance(logprobs, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x <= 1e-6
        for x in logprobs
    ):
        raise ValueError(f"logprobs are not a list of finite log-probabilities: {str(logprobs)[:80]}")
    if len(token_ids) != len(logprobs):
        raise ValueError(f"{len(token_ids)} token ids but {len(logprobs)} logprobs")
    if finish_reason not in ("stop", "length", "abort"):
        raise ValueError(f"unknown finish reason {finish_reason!r}")
    reason: FinishReason = finish_reason
    return Generation(token_ids, [float(x) for x in logprobs], reason)


@dataclass(eq=False)
class Replica:
    url: str
    healthy: bool = True
    reason: str = ""
    probe_at: float = 0.0  # loop time after which an unhealthy replica is probed again
    probe: asyncio.Task[None] | None = None


class _Retryable(Exception):
    """(where, reason): this try failed before any server could start the request."""


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _weight(url: str, request_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{url}\0{request_id}".encode(), digest_size=8).digest(), "big")


class RemoteEngine:
    """`TokenEngine` over replicas of one server kind. One instance serves a whole run (all episodes)."""

    def __init__(
        self,
        urls: Sequence[str],
        dialect: Dialect,
        config: RemoteConfig | None = None,
        *,
        timeout_s: float = 300.0,
        retries: int = 3,
    ) -> None:
        if not urls:
            raise ConfigError("RemoteEngine needs at least one replica URL")
        self.dialect = dialect
        self.config = config or RemoteConfig()
        self.timeout_s = timeout_s
        self.retries = retries
        self.replicas = [Replica(url.rstrip("/")) for url in urls]
        self._sticky: collections.OrderedDict[str, Replica] = collections.OrderedDict()
        self._tag = secrets.token_hex(3)  # call ids stay unique across engines sharing request ids
        self._calls = 0
        self._warned = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None
        self._headers = {"content-type": "application/json"}
        key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
        if key:
            self._headers["authorization"] = f"Bearer {key}"

    @property
    def logprobs(self) -> LogprobKind:
        return self.dialect.logprobs

    def __repr__(self) -> str:
        return f"RemoteEngine({self.dialect.name}: {', '.join(r.url for r in self.replicas)})"

    # -- TokenEngine ----------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> Generation:
        if not prompt_ids:
            raise EngineError(f"request {request_id!r}: empty prompt; a generation needs at least one token")
        self._calls += 1
        call_id = f"{request_id}-{self._tag}{self._calls}"
        if sampling.seed is not None and not self.config.send_seed:
            sampling = sampling.model_copy(update={"seed": None})
        if self.dialect.logprobs == "after_temperature" and sampling.temperature not in (0.0, 1.0):
            self._warn_logprobs(sampling.temperature)
        body = self.dialect.request(list(prompt_ids), sampling, call_id)
        content = json.dumps(body, separators=(",", ":")).encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        attempt = 0
        while True:
            try:
                return await self._attempt(request_id, call_id, content, sampling, deadline)
            except _Retryable as exc:
                where, reason = exc.args
            if attempt >= self.retries:
                raise EngineError(
                    f"{where}: request {call_id}: {reason} (gave up after {attempt + 1} attempts, "
                    "model.max_retries)"
                )
            delay = min(_BACKOFF_CAP_S, self.config.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
            if loop.time() + delay >= deadline:
                raise EngineError(
                    f"{where}: request {call_id}: {reason}; no time left to retry within "
                    f"{self.timeout_s:g}s (model.timeout_s)"
                )
            attempt += 1
            log.info("%s: retrying request %s in %.2fs (%s)", where, call_id, delay, reason)
            await asyncio.sleep(delay)

    async def _attempt(
        self, request_id: str, call_id: str, content: bytes, sampling: SamplingParams, deadline: float
    ) -> Generation:
        """One try. Raises `_Retryable` only where the server cannot have started the request."""
        replica = await self._route(request_id)
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._client().post(
                    replica.url + self.dialect.generate_path, content=content, headers=self._headers
                )
        except TimeoutError:
            self._abort(replica, call_id)
            raise EngineError(
                f"{replica.url}: request {call_id} got no answer within {self.timeout_s:g}s "
                "(model.timeout_s); aborted"
            ) from None
        except asyncio.CancelledError:
            self._abort(replica, call_id)
            raise
        except _UNSENT as exc:
            self._mark_down(replica, _describe(exc))
            raise _Retryable(replica.url, _describe(exc)) from None
        except httpx.HTTPError as exc:  # the server had the whole request: never retried
            self._mark_down(replica, _describe(exc))
            self._abort(replica, call_id)
            raise EngineError(
                f"{replica.url}: request {call_id} failed after it was sent ({_describe(exc)}); "
                "not retried (a retry could sample a different completion for the same turn)"
            ) from exc
        if response.status_code == 503:
            raise _Retryable(replica.url, f"HTTP 503 (overloaded): {response.text[:200]}")
        return self._parse(replica, response, call_id, sampling)

    def _warn_logprobs(self, temperature: float) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "%s returns logprobs after temperature scaling; at temperature %g they are not the raw "
                "model logprobs a trainer recomputes (see the dialect's docstring for the server setting)",
                self.dialect.name,
                temperature,
            )

    def _parse(
        self, replica: Replica, response: httpx.Response, call_id: str, sampling: SamplingParams
    ) -> Generation:
        where = f"{replica.url}: request {call_id}"
        if response.status_code != 200:
            raise EngineError(f"{where}: HTTP {response.status_code}: {response.text[:300]}")
        try:
            result = self.dialect.response(response.json(), sampling)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise EngineError(
                f"{where}: the answer is not a usable {self.dialect.name} completion ({exc}): "
                f"{response.text[:200]}"
            ) from exc
        if not result.token_ids:
            raise EngineError(
                f"{where}: the server returned no tokens (finish reason {result.finish_reason})"
            )
        if len(result.token_ids) > sampling.max_tokens:
            raise EngineError(
                f"{where}: the server returned {len(result.token_ids)} tokens "
                f"for max_tokens {sampling.max_tokens}"
            )
        return result

    # -- routing and health ----------------------------------------------------------------------
    async def _route(self, request_id: str) -> Replica:
        self._probe_due()
        replica = self._sticky.get(request_id)
        if replica is not None and replica.healthy:
            self._sticky.move_to_end(request_id)
            return replica
        healthy = [r for r in self.replicas if r.healthy]
        if not healthy:
            await asyncio.gather(*(self._probe_now(r) for r in self.replicas))
            healthy = [r for r in self.replicas if r.healthy]
            if not healthy:
                reasons = "; ".join(f"{r.url}: {r.reason}" for r in self.replicas)
                raise _Retryable(self.dialect.name, f"no healthy replica ({reasons})")
        replica = max(healthy, key=lambda r: _weight(r.url, request_id))
        self._sticky[request_id] = replica
        self._sticky.move_to_end(request_id)
        if len(self._sticky) > _STICKY_CAPACITY:
            self._sticky.popitem(last=False)
        return replica

    def _mark_down(self, replica: Replica, reason: str) -> None:
        if replica.healthy:
            log.warning("%s replica %s marked unhealthy: %s", self.dialect.name, replica.url, reason)
        replica.healthy = False
        replica.reason = reason
        replica.probe_at = asyncio.get_running_loop().time() + self.config.health_interval_s

    def _probe_due(self) -> None:
        now = asyncio.get_running_loop().time()
        for replica in self.replicas:
            if not replica.healthy and replica.probe is None and now >= replica.probe_at:
                self._start_probe(replica)

    def _start_probe(self, replica: Replica) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._probe(replica))
        replica.probe = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _probe_now(self, replica: Replica) -> None:
        task = replica.probe if replica.probe is not None else self._start_probe(replica)
        await asyncio.shield(task)

    async def _probe(self, replica: Replica) -> None:
        try:
            response = await self._client().get(
                replica.url + self.dialect.health_path,
                headers=self._headers,
                timeout=self.config.health_timeout_s,
            )
            reason = self.dialect.unhealthy(response)
        except httpx.HTTPError as exc:
            reason = _describe(exc)
        finally:
            replica.probe = None
        if reason is None:
            if not replica.healthy:
                log.info("%s replica %s is healthy again", self.dialect.name, replica.url)
            replica.healthy, replica.reason = True, ""
        else:
            self._mark_down(replica, reason)

    async def health(self) -> list[tuple[str, bool, str]]:
        """Probe every replica now: `(url, healthy, reason)` each (what doctor and preflight show)."""
        await asyncio.gather(*(self._probe_now(r) for r in self.replicas))
        return [(r.url, r.healthy, r.reason or "healthy") for r in self.replicas]

    async def check(self) -> str:
        """Preflight: at least one replica answers its health check, else `EngineError` naming each."""
        rows = await self.health()
        up = [url for url, ok, _ in rows if ok]
        if not up:
            raise EngineError(
                f"{self.dialect.name}: no replica is healthy: "
                + "; ".join(f"{u}: {why}" for u, _, why in rows)
            )
        return f"{self.dialect.name}: {len(up)}/{len(rows)} replicas healthy"

    # -- abort and lifecycle ---------------------------------------------------------------------
    def _abort(self, replica: Replica, call_id: str) -> None:
        """Tell the server to stop `call_id` when it has an abort call (the connection is closed anyway)."""
        spec = self.dialect.abort(call_id)
        if spec is None:
            return
        path, body = spec
        task = asyncio.get_running_loop().create_task(self._send_abort(replica, path, body, call_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_abort(self, replica: Replica, path: str, body: dict[str, Any], call_id: str) -> None:
        try:
            response = await self._client().post(
                replica.url + path, json=body, headers=self._headers, timeout=self.config.health_timeout_s
            )
            if response.status_code >= 400:
                log.warning("%s: abort of %s answered HTTP %s", replica.url, call_id, response.status_code)
        except httpx.HTTPError as exc:
            log.warning("%s: abort of %s failed: %s", replica.url, call_id, _describe(exc))

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop:
            # A client's pooled connections belong to the loop that opened them: one client per loop.
            limit = self.config.max_connections
            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=self.config.connect_timeout_s),
                limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
            )
            self._http_loop = loop
        return self._http

    async def aclose(self) -> None:
        """Let pending aborts go out (briefly), stop probes, close the connection pool."""
        aborts = [t for t in self._tasks if not any(t is r.probe for r in self.replicas)]
        if aborts:
            await asyncio.wait(aborts, timeout=self.config.health_timeout_s)
        for task in list(self._tasks):
            task.cancel()
        if self._http is not None and self._http_loop is asyncio.get_running_loop():
            await self._http.aclose()
        self._http = None

    async def __aenter__(self) -> RemoteEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
