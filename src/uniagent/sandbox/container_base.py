"""What the container runtimes share: `ContainerConfig`, the CLI runner and `ContainerSandbox`, the
base class whose constructor builds the runtime's own class (`OciSandbox` for docker and podman,
container_oci.py; `ApptainerSandbox`, apptainer.py). Each runtime's class registers itself for
its `runtimes` when its module loads, so this module imports none of them (no cycle); the backend
module, container.py, imports them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field

from uniagent.errors import ConfigError, SandboxDeadError, SandboxError, SandboxStartError
from uniagent.sandbox.pipe import PipeShellSandbox
from uniagent.sandbox.procs import spawn
from uniagent.sandbox.settings import SandboxConfig


class ContainerConfig(SandboxConfig):
    """docker, podman or apptainer through their command-line tools."""

    type: Literal["container"] = "container"
    runtime: Literal["docker", "podman", "apptainer"] = "docker"
    image: str | None = Field(None, description="the image to run; a task row's own image replaces it")
    pull: Literal["always", "missing", "never"] = "missing"
    network: bool = False
    run_args: list[str] = Field(default_factory=list, description="extra arguments for `run`")
    executable: str | None = Field(None, description="path of the CLI when not on PATH")
    build: str | None = Field(
        None,
        description="a directory with a Dockerfile: `image` is built from it when missing (docker, podman; "
        "a Harbor task's environment)",
    )
    build_timeout_s: float = Field(600.0, gt=0, description="how long that build may take")


CLI_TIMEOUT_S = 60.0


@dataclass
class CliResult:
    """What a CLI call returned; `err` is stderr decoded for messages."""

    rc: int
    out: bytes
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def message(self) -> str:
        text = (self.err.strip() or self.out.decode(errors="replace").strip())[-2000:]
        return text or f"exit status {self.rc}"


async def run_cli(
    argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = CLI_TIMEOUT_S
) -> CliResult:
    """Run a CLI to completion without blocking the loop; killed on timeout or cancellation."""
    try:
        proc = await spawn(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise SandboxError(f"{argv[0]} is not installed or not on PATH: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        raise SandboxError(f"`{' '.join(argv[:3])} ...` did not finish within {timeout:g}s") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)
    return CliResult(proc.returncode or 0, out, err.decode(errors="replace"))


class ContainerSandbox(PipeShellSandbox):
    """A docker, podman or apptainer container driven through its CLI.

    `ContainerSandbox(config)` builds the runtime's own class (`OciSandbox` for docker and
    podman, `ApptainerSandbox`); each implements `_prepare_image`, `_launch`, `_exec_argv`,
    `_stop` and `_alive`.
    """

    kind = "container"

    runtimes: ClassVar[tuple[str, ...]] = ()
    """The `runtime` values a subclass drives; it is registered for them when its module loads."""
    _by_runtime: ClassVar[dict[str, type[ContainerSandbox]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for runtime in cls.__dict__.get("runtimes", ()):  # declared here, not inherited
            ContainerSandbox._by_runtime[runtime] = cls

    def __new__(cls, config: ContainerConfig) -> Any:
        if cls is ContainerSandbox:
            found = ContainerSandbox._by_runtime.get(config.runtime)
            if found is None:  # the backend module (container.py) imports every runtime's
                raise ConfigError(f"sandbox.runtime {config.runtime!r}: no container sandbox drives it")
            cls = found
        return super().__new__(cls)

    def __init__(self, config: ContainerConfig) -> None:
        if not config.image:
            raise ConfigError(
                "sandbox.image: a container sandbox needs an image; set it, or run tasks whose rows name one"
            )
        super().__init__(config)
        self.config: ContainerConfig = config
        self.runtime = config.runtime
        self.name = self._new_name()
        self.cli: str = config.executable or self._default_cli()
        self._image_ref: str = config.image

    # -- what each runtime does ----------------------------------------------------------
    @abstractmethod
    async def _prepare_image(self) -> None:
        """Make the image available (pull, resolve); once, before the timed and retried start."""

    @abstractmethod
    async def _launch(self) -> None:
        """Start the container named `self.name`."""

    @abstractmethod
    def _exec_argv(self, argv: list[str]) -> list[str]:
        """The CLI command line that runs argv inside the container with stdin attached."""

    # -- shared ----------------------------------------------------------------------------
    def _default_cli(self) -> str:
        return self.runtime

    @staticmethod
    def _new_name() -> str:
        return f"uniagent-{secrets.token_hex(6)}"

    async def _cli(
        self, *args: str, stdin: bytes | None = None, timeout: float | None = CLI_TIMEOUT_S
    ) -> CliResult:
        return await run_cli([self.cli, *args], stdin=stdin, timeout=timeout)

    def _what(self) -> str:
        return f"{self.runtime} container {self.name}"

    def _check_running(self) -> None:
        if not self._started or self._stopped:
            raise SandboxDeadError(f"the {self.runtime} sandbox is not running (start it first)")

    async def start(self) -> None:
        """Resolve the CLI and the image once, outside the timed and retried start: a pull
        may take minutes, and a missing image or CLI is not fixed by retrying."""
        if not self._started and not self._stopped:
            if shutil.which(self.cli) is None:
                raise SandboxStartError(
                    f"the {self.runtime} CLI {self.cli!r} was not found; install it or set "
                    "`executable` in the container config"
                )
            await self._prepare_image()
        await super().start()

    async def _start(self) -> None:
        self.name = self._new_name()
        await self._launch()

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        return await spawn(
            *self._exec_argv(argv),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
