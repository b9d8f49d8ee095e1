"""No isolation: commands run on this machine as the current user. Opt-in only, and loud."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Literal

from pydantic import Field

from uniagent.errors import ConfigError
from uniagent.sandbox.pipe import PipeShellSandbox
from uniagent.sandbox.procs import find_with_arg, signal_descendants, signal_pids, spawn
from uniagent.sandbox.settings import SandboxConfig
from uniagent.sandbox.shell import ShellSession


class HostConfig(SandboxConfig):
    """No isolation at all: commands run as the current user on this machine. Opt-in only."""

    type: Literal["host"] = "host"
    workdir: str = Field(".", description="working directory on the host")
    i_understand_there_is_no_isolation: bool = False


log = logging.getLogger(__name__)


class HostSandbox(PipeShellSandbox):
    """For trusted code and debugging. The model's commands can touch everything you can."""

    kind = "host"
    kill_trees_on_stop = True

    def __init__(self, config: HostConfig) -> None:
        if not config.i_understand_there_is_no_isolation:
            raise ConfigError(
                "sandbox type `host` runs model commands on this machine without isolation; "
                "set i_understand_there_is_no_isolation: true to allow it, or use type `local`"
            )
        super().__init__(config)
        self.workdir = os.path.abspath(config.workdir)
        self.tools_dir = os.path.join(self.workdir, ".uniagent", "bin")

    async def _start(self) -> None:
        log.warning("HOST SANDBOX: commands run on this machine WITHOUT ISOLATION in %s", self.workdir)
        os.makedirs(self.workdir, exist_ok=True)

    async def _stop(self) -> None:
        return None

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        return await spawn(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
        )

    async def _kill_shell(self, session: ShellSession) -> None:
        return None  # the launched process is the shell itself

    def _shell(self, session: ShellSession) -> int | None:
        if session.proc is None:
            return None
        return find_with_arg(session.proc.pid, session.token, "bash") or session.proc.pid

    async def _signal_tree(self, session: ShellSession, sig: int) -> None:
        if (shell := self._shell(session)) is not None:
            signal_descendants(shell, sig)

    async def _signal_shell(self, session: ShellSession, sig: int) -> None:
        if (shell := self._shell(session)) is not None:
            signal_pids([shell], sig)


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor`: run a command on the host backend (opt-in, no isolation)."""
    import tempfile

    from uniagent.sandbox.base import probe

    with tempfile.TemporaryDirectory(prefix="uniagent-doctor-") as workdir:
        cfg = HostConfig(workdir=workdir, i_understand_there_is_no_isolation=True, start_retries=0)
        ok, detail = await probe(HostSandbox(cfg))
    return [("sandbox host (no isolation, opt-in)", ok, detail)]
