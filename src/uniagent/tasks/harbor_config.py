"""Harbor's task directory, read and validated: `task.toml` (both schema versions), the
instruction, the environment's Dockerfile, the verifier's tests and the oracle's solution.

Why a model of our own rather than the `harbor` package from PyPI: that package needs Python
>= 3.12 (uniagent supports 3.11) and brings its whole runner (trials, jobs, environments, agents)
with it; what uniagent needs is only the file format, which is small and documented. Field names
are Harbor's. Two schema versions exist:

- legacy (`version = "1.0"`): free-form `[metadata]`, `[verifier]`/`[agent]` timeouts,
  `[environment]` resources (with the deprecated `memory = "2G"` / `storage` spellings);
- current (`schema_version = "1.x"`): a `[task]` table (name, description, authors, keywords),
  `user` for the agent and the verifier, `[solution] env`, `[environment] os`.

Harbor's own models ignore keys they do not know (newer task formats add some), so these do too,
with a warning naming each (`TaskToml.unknown_keys`): a misspelt key is said, not silently used
as a default, and a task written for a newer Harbor still loads. Values are strict (types,
bounds, one schema version), and `[metadata]` is free-form, as in Harbor. Settings uniagent
cannot honour (GPUs, TPUs, MCP servers, Windows, several steps, a health check, a separate
verifier environment) are refused when the task is loaded, never ignored.
"""

from __future__ import annotations

import logging
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from uniagent.config import first_error
from uniagent.errors import ConfigError

log = logging.getLogger(__name__)

TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"
LOGS_DIR = "/logs"
VERIFIER_LOGS = "/logs/verifier"
"""Harbor's fixed paths: tests are uploaded to /tests after the agent finishes, the verifier
writes its reward to /logs/verifier/reward.txt (one number) or reward.json (named numbers)."""
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


class _Strict(BaseModel):
    """A section of task.toml: its fields typed; keys it does not know kept in `model_extra`."""

    model_config = ConfigDict(extra="allow")


def _size_mb(value: Any) -> int:
    """Harbor's deprecated size text ('2G', '512M') in MB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(value), re.I)
    if not m:
        raise ValueError(f"{value!r} is not a size such as '2G' or '512M'")
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return max(1, int(float(m.group(1)) * scale))


class VerifierSection(_Strict):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | None = None


class AgentSection(_Strict):
    timeout_sec: float = Field(600.0, gt=0)
    user: str | None = None


class SolutionSection(_Strict):
    env: dict[str, str] = Field(default_factory=dict)


class EnvironmentSection(_Strict):
    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    os: str = "linux"
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, ge=16)
    storage_mb: int | None = Field(None, ge=1)
    memory: str | None = Field(None, description="deprecated spelling of memory_mb ('2G')")
    storage: str | None = Field(None, description="deprecated spelling of storage_mb ('10G')")
    gpus: int = Field(0, ge=0)
    gpu_types: list[str] | None = None
    allow_internet: bool = True
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    skills_dir: str | None = None
    tpu: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _normalize(self) -> EnvironmentSection:
        if self.memory is not None and self.memory_mb is None:
            self.memory_mb = _size_mb(self.memory)
        if self.storage is not None and self.storage_mb is None:
            self.storage_mb = _size_mb(self.storage)
        return self


class Author(_Strict):
    name: str
    email: str | None = None


class TaskSection(_Strict):
    name: str
    description: str | None = None
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class TaskToml(_Strict):
    """One `task.toml`, either schema version (`schema` says which was read)."""

    version: str | None = Field(None, description="legacy schema: '1.0'")
    schema_version: str | None = Field(None, description="current schema: '1.1', '1.2', ...")
    task: TaskSection | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    source: str | None = None

    @model_validator(mode="after")
    def _one_schema(self) -> TaskToml:
        if self.version is not None and self.schema_version is not None:
            raise ValueError("give either `version` (legacy schema) or `schema_version`, not both")
        if self.task is not None and self.schema_version is None and self.version is not None:
            raise ValueError("a [task] table belongs to the current schema: set `schema_version`")
        return self

    @property
    def schema(self) -> str:
        return "current" if self.schema_version is not None or self.task is not None else "legacy"

    def unknown_keys(self) -> list[str]:
        """Dotted keys of task.toml that no field here reads (metadata aside)."""
        out = [str(k) for k in self.model_extra or {}]
        for name in ("task", "verifier", "agent", "solution", "environment"):
            section = getattr(self, name)
            if section is not None:
                out += [f"{name}.{k}" for k in section.model_extra or {}]
        return out

    def unsupported(self) -> str | None:
        """Why uniagent cannot run this task as Harbor would, or None."""
        unknown = self.unknown_keys()
        for key in REFUSED_KEYS:
            if key in unknown:
                return f"{key}: {REFUSED_KEYS[key]}"
        env = self.environment
        if env.os.lower() != "linux":
            return f"environment.os = {env.os!r}: only linux tasks run here"
        if env.gpus:
            return f"environment.gpus = {env.gpus}: no sandbox backend here gives a task GPUs"
        if env.tpu:
            return "environment.tpu: no sandbox backend here gives a task TPUs"
        if env.mcp_servers:
            return "environment.mcp_servers: MCP servers are not supported by uniagent's agents"
        if env.skills_dir:
            return "environment.skills_dir: agent skills are not supported"
        return None


REFUSED_KEYS = {
    "steps": "multi-step Harbor tasks are not supported",
    "environment.healthcheck": "a health check before the agent starts is not supported",
    "verifier.environment": "a separate verifier environment is not supported (the verifier runs "
    "in the agent's sandbox)",
}
"""Keys newer Harbor versions read whose meaning uniagent cannot give: refused, not ignored."""


@dataclass
class Dockerfile:
    """What a task's Dockerfile does, as far as deciding where it can run: its base image, and
    whether it only places files (`plain`), in which case the files are copied at setup."""

    base: str
    workdir: str = "/"
    copies: list[tuple[str, str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)
    """Instructions beyond FROM, WORKDIR, COPY/ADD of local files and ENV (RUN, USER, ...)."""

    @property
    def plain(self) -> bool:
        return not self.other


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def parse_dockerfile(text: str, where: str) -> Dockerfile:
    """The parts of a Dockerfile that decide where its task runs; a one-line error for one that
    does not start FROM an image."""
    steps = _instructions(text)
    steps = [s for s in steps if s[0] != "ARG"] if steps and steps[0][0] == "ARG" else steps
    if not steps or steps[0][0] != "FROM":
        raise ConfigError(f"{where}: a Dockerfile must start with FROM <image>")
    base = steps[0][1].split()[0] if steps[0][1] else ""
    if not base or " AS " in f" {steps[0][1].upper()} ":
        raise ConfigError(f"{where}: FROM needs one image (multi-stage builds need a built image)")
    df = Dockerfile(base)
    for word, args in steps[1:]:
        if word == "WORKDIR":
            df.workdir = args if args.startswith("/") else f"{df.workdir.rstrip('/')}/{args}"
        elif word in ("COPY", "ADD"):
            parts = shlex.split(args)
            if any(p.startswith("--") for p in parts) or len(parts) < 2 or "://" in args:
                df.other.append(f"{word} {args}")
                continue
            *sources, dest = parts
            df.copies += [(s, dest) for s in sources]
        elif word == "ENV":
            parts = shlex.split(args)
            if parts and all("=" in p for p in parts):
                df.env.update(p.split("=", 1) for p in parts)  # type: ignore[arg-type]
            elif len(parts) >= 2:
                df.env[parts[0]] = " ".join(parts[1:])
        else:
            df.other.append(f"{word} {args}"[:80])
    return df


@dataclass
class HarborDir:
    """One validated Harbor task directory."""

    path: Path
    name: str
    config: TaskToml
    instruction: str
    dockerfile: Dockerfile | None

    @property
    def tests(self) -> Path:
        return self.path / "tests"

    @property
    def solution(self) -> Path | None:
        p = self.path / "solution" / "solve.sh"
        return p if p.is_file() else None


def read_toml(path: Path) -> TaskToml:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    try:
        return TaskToml.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {first_error(exc)}") from None


def read_task_dir(path: Path) -> HarborDir:
    """A Harbor task directory, checked file by file; a one-line ConfigError for the first
    thing missing, malformed or not supported."""
    toml_path = path / "task.toml"
    if not toml_path.is_file():
        raise ConfigError(f"{path}: not a Harbor task (no task.toml)")
    config = read_toml(toml_path)
    unknown = [k for k in config.unknown_keys() if k not in REFUSED_KEYS]
    if unknown:
        log.warning("%s: ignoring keys this reader does not know: %s", toml_path, ", ".join(unknown))
    why = config.unsupported()
    if why:
        raise ConfigError(f"{toml_path}: {why}")
    if (path / "steps").is_dir():
        raise ConfigError(f"{path}: multi-step Harbor tasks are not supported")
    instruction = path / "instruction.md"
    if not instruction.is_file() or not instruction.read_text().strip():
        raise ConfigError(f"{path}: instruction.md is missing or empty")
    if not (path / "tests" / "test.sh").is_file():
        raise ConfigError(f"{path}: tests/test.sh is missing (the verifier's entry point)")
    env_dir = path / "environment"
    compose = [n for n in COMPOSE_FILES if (env_dir / n).is_file()]
    if compose:
        raise ConfigError(
            f"{env_dir / compose[0]}: multi-container (compose) Harbor tasks are not supported; "
            "uniagent runs a task in one sandbox"
        )
    dockerfile = None
    if (env_dir / "Dockerfile").is_file():
        dockerfile = parse_dockerfile((env_dir / "Dockerfile").read_text(), str(env_dir / "Dockerfile"))
    elif not config.environment.docker_image:
        raise ConfigError(f"{path}: neither environment/Dockerfile nor environment.docker_image")
    name = config.task.name if config.task else path.name
    return HarborDir(path.resolve(), name, config, instruction.read_text(), dockerfile)


def task_dirs(path: Path) -> list[Path]:
    """`path` itself when it is a task, else the tasks directly under it, sorted by name."""
    if not path.is_dir():
        raise ConfigError(f"{path}: not a directory of Harbor tasks")
    if (path / "task.toml").is_file():
        return [path]
    found = sorted(p for p in path.iterdir() if (p / "task.toml").is_file())
    if not found:
        raise ConfigError(f"{path}: no Harbor task in it (no */task.toml)")
    return found


def task_rows(path: Path) -> list[dict[str, Any]]:
    """The rows `load_tasks` builds Harbor tasks from: one per task directory."""
    return [
        {"instance_id": p.name, "family": "harbor", "task_dir": str(p.resolve())} for p in task_dirs(path)
    ]
