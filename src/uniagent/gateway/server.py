"""Serve a `Gateway` with uvicorn: in this process's event loop (harness episodes, tests, benches)
or as the main program (`uniagent gateway`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uniagent.errors import UniAgentError
from uniagent.gateway.app import Gateway, check_bind

log = logging.getLogger(__name__)


class InProcessServer:
    """A uvicorn server run as a task of the running event loop. Signals are left to the host
    program (uvicorn's own `serve()` would take over SIGINT/SIGTERM). Shared by the gateway's
    server and the per-episode session sockets of the CLI harnesses."""

    server: Any
    _task: asyncio.Task[None] | None = None

    async def _serve(self, what: str, error: type[Exception] = UniAgentError) -> None:
        self._task = asyncio.create_task(self.server._serve())
        while not self.server.started:
            if self._task.done():
                raise error(f"{what} could not start: {self._task.exception()!r}")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._task is None:
            return
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        except TimeoutError:
            self.server.force_exit = True
            self._task.cancel()
        self._task = None


class GatewayServer(InProcessServer):
    """uvicorn serving `gateway.app` as a task of the running event loop.

    `port=0` picks a free port; `base_url` is known once `start()` returns.
    """

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        check_bind(host, gateway.token)
        self.gateway = gateway
        self.host = host
        config = uvicorn.Config(
            gateway.app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            timeout_keep_alive=60,
        )
        self.server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def session_url(self, session_id: str) -> str:
        """The OpenAI base URL of one session."""
        return f"{self.url}/sessions/{session_id}/v1"

    async def start(self) -> GatewayServer:
        await self._serve(f"the gateway on {self.host}:{self.port}")
        sockets = self.server.servers[0].sockets if self.server.servers else []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        return self

    async def __aenter__(self) -> GatewayServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
