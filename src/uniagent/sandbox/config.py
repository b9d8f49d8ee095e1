"""Where an episode's commands run: one pydantic model per backend, a union on `type`.

Isolation is the default (`local`: bubblewrap, no network, writes only to its workspace);
anything weaker is an explicit choice in the config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from uniagent.errors import ConfigError


class Limits(BaseModel):
    """Resource limits. `None` means no limit. Backends apply what they can and log the rest."""

    model_config = ConfigDict(extra="forbid")

    memory_mb: int | None = Field(4096, ge=16)
    pids: int | None = Field(512, ge=8)
    cpu_time_s: int | None = Field(None, ge=1, description="CPU seconds per process (RLIMIT_CPU)")
    file_size_mb: int | None = Field(1024, ge=1, description="largest file a process may write")
    open_files: int | None = Field(1024, ge=16)
    wall_clock_s: float | None = Field(None, gt=0, description="the sandbox is stopped this long after start")
    cpus: float | None = Field(None, gt=0, description="CPU share (containers, cgroup cpu quota)")


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workdir: str = Field("/workspace", description="the agent's working directory inside the sandbox")
    env: dict[str, str] = Field(default_factory=dict, description="set in every shell of the sandbox")
    limits: Limits = Field(default_factory=Limits)
    default_timeout_s: float = Field(120.0, gt=0, description="per-command timeout when none is given")
    max_output_chars: int = Field(30_000, ge=200, description="observations are clipped to this")
    start_timeout_s: float = Field(120.0, gt=0)
    start_retries: int = Field(2, ge=0)


class LocalConfig(_Common):
    """bubblewrap: host system read-only, a private writable workspace, no network by default."""

    type: Literal["local"] = "local"
    rootfs: Path | None = Field(None, description="a root filesystem directory to use instead of the host's")
    workspace: Path | None = Field(
        None, description="host directory bound at `workdir`; a fresh temp dir when unset"
    )
    keep_workspace: bool = Field(False, description="keep a temp workspace after stop (debugging)")
    network: bool = False
    host_python: bool = Field(
        True, description="expose uniagent's Python environment read-only and put it first on PATH"
    )
    ro_binds: list[str] = Field(
        default_factory=list, description="extra host paths bound read-only at the same path"
    )
    env_allowlist: list[str] = Field(
        default_factory=lambda: ["LANG", "LC_ALL", "TZ"],
        description="host variables passed through; everything else is scrubbed",
    )


class HostConfig(_Common):
    """No isolation at all: commands run as the current user on this machine. Opt-in only."""

    type: Literal["host"] = "host"
    workdir: str = Field(".", description="working directory on the host")
    i_understand_there_is_no_isolation: bool = False


class ContainerConfig(_Common):
    """docker, podman or apptainer through their command-line tools."""

    type: Literal["container"] = "container"
    runtime: Literal["docker", "podman", "apptainer"] = "docker"
    image: str
    pull: Literal["always", "missing", "never"] = "missing"
    network: bool = False
    run_args: list[str] = Field(default_factory=list, description="extra arguments for `run`")
    executable: str | None = Field(None, description="path of the CLI when not on PATH")


class SweRexConfig(_Common):
    """A SWE-ReX server: remote (URL + token) or started by uniagent inside another backend."""

    type: Literal["swerex"] = "swerex"
    url: str | None = Field(None, description="a running swerex-remote server; unset: start one")
    port: int | None = None
    auth_token: str | None = Field(None, repr=False, description="secret: never logged or stored")
    inner: dict[str, Any] | None = Field(
        None, description="the backend to start the server in when `url` is unset (default: local)"
    )


class ModalConfig(_Common):
    """A Modal sandbox through the `modal` SDK (extra `uniagent[modal]`)."""

    type: Literal["modal"] = "modal"
    image: str = Field("python:3.11-slim", description="a registry image Modal can pull")
    app_name: str = "uniagent"
    timeout_s: int = Field(3600, ge=10, description="Modal's own lifetime limit for the sandbox")
    cpu: float | None = None
    memory_mb: int | None = None
    network: bool = False


DeployConfig = Annotated[
    LocalConfig | HostConfig | ContainerConfig | SweRexConfig | ModalConfig,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(DeployConfig)


def parse_config(config: Any) -> LocalConfig | HostConfig | ContainerConfig | SweRexConfig | ModalConfig:
    """A config object, or a dict like `{"type": "local", ...}` (no `type`: local)."""
    if isinstance(config, BaseModel):
        return config  # type: ignore[return-value]
    if config is None:
        return LocalConfig()
    if not isinstance(config, dict):
        raise ConfigError(f"sandbox config must be a mapping with a `type`, got {type(config).__name__}")
    data = {"type": "local", **config}
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"sandbox.{where}: {err['msg']}") from None
