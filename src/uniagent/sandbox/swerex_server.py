"""A `swerex-remote` server that uniagent starts itself, inside another backend (`inner`).

The inner sandbox (default: `local` with network, so that its loopback is this machine's) is
created from the swerex config's `inner` (typed and checked when the config loads:
`SweRexConfig.inner_sandbox`); the server is launched from a dedicated session of it
(`SERVER_SESSION`), so timeouts in other sessions never touch it. It reads its auth token from a
pipe, never argv or the environment the agent's shells inherit. On stop, the server's process
tree is killed before the inner sandbox is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys

from uniagent.errors import SandboxStartError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import create
from uniagent.sandbox.procs import quote, tree_signal_script
from uniagent.sandbox.settings import SandboxConfig, type_of
from uniagent.sandbox.swerex_client import Client, redact

SERVER_SESSION = "_swerex_server"
"""The inner sandbox's session that launches the server (and is never used for anything else)."""

# Reads the token from stdin so it is in neither argv (visible to every user in `ps`) nor the
# environment that the server's bash sessions inherit.
_SERVER_BOOT = (
    "import sys\n"
    "token = sys.stdin.readline().strip()\n"
    "sys.argv = ['swerex-remote', '--host', '127.0.0.1', '--port', sys.argv[1], '--auth-token=' + token]\n"
    "from swerex.server import main\n"
    "main()\n"
)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (a race is retried by the start loop)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SweRexServer:
    """The inner sandbox and the server process in it, for one SweRexSandbox."""

    def __init__(self, inner: SandboxConfig, port: int | None, sandbox_id: str) -> None:
        """`inner`: the sandbox to start the server in; `port`: the server's (None: a free one)."""
        self.inner_config = inner
        self.port = port
        self.id = sandbox_id
        self.inner: Sandbox | None = None
        self.pid: str | None = None
        self.log_path: str | None = None

    async def start_inner(self) -> Sandbox:
        """Create and start the inner sandbox (kept here at once, so that stop frees it)."""
        self.inner = create(self.inner_config)
        await self.inner.start()
        return self.inner

    async def launch(self, token: str, workdir: str) -> int:
        """Start the server in the inner sandbox, in `workdir`; its port."""
        inner = self.inner
        assert inner is not None
        found = await inner.exec(
            f"(for py in {quote(sys.executable)} python3 python; do "
            '"$py" -c "import importlib.util as u, sys; sys.exit(u.find_spec(\'swerex\') is None)" '
            '2>/dev/null && { command -v "$py" || echo "$py"; exit 0; }; done; exit 127)',
            timeout=60,
            session=SERVER_SESSION,
        )
        if not found.ok:
            raise SandboxStartError(
                f"no Python with SWE-ReX inside the inner {type_of(self.inner_config)} sandbox: install it "
                "there (pip install swe-rex) or choose another `inner`"
            )
        python = found.output.strip().splitlines()[-1]
        port = self.port or free_port()
        self.log_path = f"/tmp/.uniagent-swerex-{self.id}-{port}.log"
        launch = await inner.exec(
            f"cd -- {quote(workdir)} 2>/dev/null; "
            f"printf '%s\\n' {quote(token)} | {quote(python)} -c {quote(_SERVER_BOOT)} {port} "
            f"> {self.log_path} 2>&1 &\necho $!",
            timeout=30,
            session=SERVER_SESSION,
        )
        self.pid = launch.output.strip().splitlines()[-1] if launch.ok else None
        if not self.pid or not self.pid.isdigit():
            raise SandboxStartError(f"could not launch swerex-remote: {launch.output.strip()[-300:]}")
        return port

    async def running(self) -> bool:
        assert self.inner is not None
        res = await self.inner.exec(f"kill -0 {self.pid} 2>/dev/null", timeout=10, session=SERVER_SESSION)
        return res.exit_code == 0

    async def wait_ready(self, client: Client, token: str) -> None:
        """Poll `is_alive` until the server answers; fail fast (with its log) if it exits."""
        while True:
            if (await client.is_alive(timeout=2.0)).is_alive:
                return
            if not await self.running():
                assert self.inner is not None
                tail = await self.inner.exec(
                    f"tail -c 2000 {self.log_path}", timeout=10, session=SERVER_SESSION
                )
                raise SandboxStartError(
                    "swerex-remote exited while starting: " + redact(tail.output.strip(), token)[-1500:]
                )
            await asyncio.sleep(0.05)

    async def alive(self) -> bool:
        return self.inner is not None and await self.inner.alive()

    async def stop(self) -> None:
        inner, self.inner = self.inner, None
        if inner is None:
            return
        if self.pid:
            # Kill the server and its shells first: not every backend's stop reaches processes
            # that were started in the background of one of its sessions.
            pid = int(self.pid)
            with contextlib.suppress(Exception):
                # The log lives in the inner sandbox's /tmp, which is the host's for a `host` inner.
                rm_log = f"rm -f {quote(self.log_path)}; " if self.log_path else ""
                await inner.exec(
                    f"{tree_signal_script(pid, signal.SIGKILL)}; kill -9 {pid} 2>/dev/null; {rm_log}true",
                    timeout=15,
                    session=SERVER_SESSION,
                )
            self.pid = None
        await inner.stop()
