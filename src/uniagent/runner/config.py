"""One YAML config for a run, plus dotted overrides (`--set model.temperature=0.7`).

Every section is a pydantic model with `extra="forbid"`, so a misspelt key is an error that
names it, never a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from uniagent.agent.config import AgentConfig
from uniagent.agent.registry import AgentKind
from uniagent.errors import ConfigError
from uniagent.models.config import ModelConfig

M = TypeVar("M", bound=BaseModel)


class TasksConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: str = Field("builtin:starter", description="builtin:NAME or a task file")
    family: str | None = None
    limit: int | None = Field(None, ge=1)
    ids: list[str] | None = None


class RunnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output: Path = Path("runs/latest")
    concurrency: int = Field(4, ge=1, description="episodes at once")
    samples: int = Field(1, ge=1, description="episodes per task")
    sandbox_start_concurrency: int = Field(
        16, ge=1, description="sandbox starts at once (a local one takes ~0.1 s; 4 queued 1,000 for minutes)"
    )
    backend: Literal["local", "ray"] = "local"
    ray_address: str | None = Field(None, description="ray cluster address; unset: start a local one")
    ray_actors: int | None = Field(
        None, ge=1, description="Ray actors hosting episodes, spread over nodes; unset: min(concurrency, 8)"
    )
    resume: bool = False
    retry_failed: bool = Field(
        True, description="on resume, rerun pairs that ended in an infrastructure failure"
    )
    seed: int = 0
    preflight: bool = Field(
        True, description="before the first episode, check that the model answers and a sandbox runs"
    )
    stop_after_infra_failures: int = Field(
        8, ge=0, description="stop when the first N episodes all end in one infrastructure failure (0: never)"
    )
    progress_interval_s: float = Field(
        30.0, gt=0, description="without a terminal: seconds between plain progress lines"
    )


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig)
    sandbox: dict[str, Any] = Field(default_factory=lambda: {"type": "local"})
    agent: AgentConfig = Field(default_factory=AgentConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    agent_kind: AgentKind = Field(
        "react",
        description="who acts, a kind of the agent registry: react (our loop) | "
        "mini-swe-agent[:CONFIG] (a black-box harness through the gateway)",
    )


def set_dotted(data: dict[str, Any], key: str, raw: str) -> None:
    """`a.b.c=value`, the value parsed as YAML (numbers, booleans, lists work)."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"--set {key}: empty key segment")
    node = data
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
        node = nxt
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        node[parts[-1]] = raw


def load_config_data(
    path: Path | None = None, overrides: list[str] | None = None, flags: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A YAML file (optional), then flags, then `KEY=VALUE` overrides, as one nested dict."""
    data: dict[str, Any] = {}
    if path is not None:
        if not Path(path).exists():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping")
    for key, value in (flags or {}).items():
        if value is not None:
            set_dotted(data, key, value if isinstance(value, str) else yaml.safe_dump(value).strip())
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        set_dotted(data, key.strip(), value)
    return data


def validate_config(model: type[M], data: dict[str, Any]) -> M:
    """Validate; the first error becomes one line naming the key. A `sandbox` section is
    checked against the sandbox union too."""
    try:
        cfg = model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"config {where}: {err['msg']}") from None
    sandbox = getattr(cfg, "sandbox", None)
    if sandbox is not None:
        from uniagent.sandbox import parse_config

        try:
            parse_config(sandbox)
        except ConfigError as exc:
            raise ConfigError(f"config {exc}") from None
    return cfg


def build_config(
    path: Path | None = None, overrides: list[str] | None = None, flags: dict[str, Any] | None = None
) -> RunConfig:
    return validate_config(RunConfig, load_config_data(path, overrides, flags))
