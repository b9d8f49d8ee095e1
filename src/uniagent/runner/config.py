"""One YAML config for a run, plus dotted overrides (`--set model.temperature=0.7`), loaded by
the one config loader (`uniagent.config`).

Every section is a pydantic model with `extra="forbid"`, so a misspelt key is an error that
names it, never a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from uniagent.agent.config import AgentConfig
from uniagent.config import build
from uniagent.models.config import ModelConfig
from uniagent.registry import Entry, Registry
from uniagent.sandbox.config import SandboxSection, default_section
from uniagent.tasks.registry import SuiteSpec

# One line per runner backend (`runner.backend`): where a run's pending episodes execute. `local`
# is the Runner's own loop; any other line names `async def run_on_X(config, todo, on_result,
# stopped)` (runner/ray_backend.py's `run_on_ray` is the shape).
RUN_BACKENDS = Registry(
    "runner backend",
    {
        "local": Entry("uniagent.runner.run:Runner", "episodes in this process, runner.concurrency at once"),
        "ray": Entry(
            "uniagent.runner.ray_backend:run_on_ray",
            "Ray actors, on a cluster at runner.ray_address",
            doctor="uniagent.runner.ray_backend",
            install="pip install ray",
        ),
    },
)


RunBackend = RUN_BACKENDS.field_type()
"""`runner.backend`, checked against `RUN_BACKENDS` when the config is built."""


class TasksConfig(BaseModel):
    """Which tasks a run (and, with another default, training: `TrainTasksConfig`) takes."""

    model_config = ConfigDict(extra="forbid")

    spec: SuiteSpec = Field(
        "builtin:starter", description="builtin:NAME, harbor:DIR (Harbor task directories) or a task file"
    )
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
    backend: RunBackend = Field("local", description=RUN_BACKENDS.choices())
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
    sandbox: SandboxSection = Field(default_factory=default_section)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)


def build_config(
    path: Path | None = None, overrides: list[str] | None = None, flags: dict[str, Any] | None = None
) -> RunConfig:
    return build(RunConfig, path, overrides, flags)
