"""SWE-ReX's HTTP client (`RemoteRuntime`) made fit for a sandbox: deadlines, one connection
pool, and errors that never carry the auth token. See `Client`."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import aiohttp
from pydantic import BaseModel
from swerex.runtime.remote import RemoteRuntime

_SLACK_S = 30.0
"""Client-side deadline beyond a request's own timeout: the server checks syntax, expects the
prompt and eats trailing output before it answers."""

_DEFAULT_DEADLINE_S = 300.0


class RemoteError(Exception):
    """An exception raised inside the server, carried back by class name (SWE-ReX's transfer)."""

    def __init__(self, class_path: str, message: str) -> None:
        super().__init__(message)
        self.class_path = class_path
        self.name = class_path.rpartition(".")[2]


class HttpError(Exception):
    """A 4xx/5xx answer without a transferred exception (401/403: wrong token)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


class Client(RemoteRuntime):
    """SWE-ReX's `RemoteRuntime` with three changes that a sandbox needs.

    * Every request has a deadline derived from its own timeout: the stock client posts with
      aiohttp's 5-minute default, so a 10-minute test run would fail on the client while the
      server kept running it, and a hung server would hang the episode forever.
    * One `aiohttp.ClientSession` per sandbox instead of one per request.
    * Server-side exceptions become `RemoteError` without the stock client's `print()` and
      critical-level traceback log (a timeout is an ordinary event here), and HTTP errors
      become `HttpError`, whose repr, unlike aiohttp's, does not carry the request headers,
      i.e. the token.
    """

    def __init__(self, *, host: str, port: int | None, token: str, logger: logging.Logger) -> None:
        super().__init__(host=host, port=port, auth_token=token, timeout=10.0, logger=logger)
        self._http: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            # force_close: a kept-alive connection the server dropped while idle would look like
            # a dead server on the next POST (which must not be blindly retried).
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _handle_transfer_exception(self, exc_transfer: Any) -> None:
        raise RemoteError(exc_transfer.class_path, exc_transfer.message)

    async def _handle_response_errors(self, response: aiohttp.ClientResponse) -> None:
        if response.status == 511:
            data = await response.json()
            exc = data.get("swerexception", {})
            raise RemoteError(str(exc.get("class_path", "")), str(exc.get("message", "")))
        if response.status >= 400:
            try:
                detail = str((await response.json()).get("detail", response.reason))
            except Exception:
                detail = str(response.reason)
            raise HttpError(response.status, detail)

    async def _request(
        self, endpoint: str, payload: BaseModel | None, output_class: Any, num_retries: int = 0
    ) -> Any:
        own = getattr(payload, "timeout", None) or getattr(payload, "startup_timeout", None)
        deadline = own + _SLACK_S if own else _DEFAULT_DEADLINE_S
        headers = {**self._headers, "X-Request-ID": str(uuid.uuid4())}
        body = payload.model_dump() if payload is not None else None
        for attempt in range(2):
            try:
                async with self._client().post(
                    f"{self._api_url}/{endpoint}",
                    json=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=deadline, sock_connect=30),
                ) as resp:
                    await self._handle_response_errors(resp)
                    return output_class(**await resp.json())
            except aiohttp.ClientConnectorError:
                # Nothing was sent: safe to retry once (a server restarting, a full backlog).
                if attempt:
                    raise
                await asyncio.sleep(0.2)
        raise AssertionError("unreachable")


class RedactingLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The logger SWE-ReX's client writes to: anything that contains the token is masked."""

    def __init__(self, logger: logging.Logger, token: str) -> None:
        super().__init__(logger, {})
        self._token = token

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        text = str(msg) % args if args else str(msg)
        kwargs.pop("exc_info", None)  # tracebacks may hold aiohttp errors that repr the headers
        self.logger.log(level, "%s", redact(text, self._token), **kwargs)


def redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text
