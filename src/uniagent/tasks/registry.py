"""Task families, bundled suites, and turning a `--tasks` argument into Task objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uniagent.errors import ConfigError
from uniagent.registry import Entry, Registry
from uniagent.tasks.base import Task
from uniagent.tasks.loading import load_rows

# One line per task family (a `uniagent.registry.Registry`): a family is one module with its
# `Task` subclass plus one line here; `detect_family` below tells a row's family by its fields.
FAMILIES = Registry(
    "task family",
    {
        "swe": Entry("uniagent.tasks.swe:SweTask", "SWE-bench rows: a repo, a problem, hidden tests"),
        "swe_rebench": Entry("uniagent.tasks.swe_rebench:SweRebenchTask", "SWE-rebench rows"),
        "r2e_gym": Entry("uniagent.tasks.r2e_gym:R2EGymTask", "R2E-Gym rows (docker_image)"),
        "search": Entry("uniagent.tasks.search:SearchTask", "questions answered by searching a corpus"),
        "lookup": Entry("uniagent.tasks.lookup:LookupTask", "read files, finish with the code they hold"),
        "harbor": Entry("uniagent.tasks.harbor:HarborTask", "Harbor task directories (harbor:DIR)"),
    },
)

BUILTIN = Path(__file__).parent / "builtin"


@dataclass(frozen=True)
class Suite:
    """A bundled task suite: its rows file (under tasks/builtin/), the family of its rows, and
    fields every row gets unless it has its own."""

    file: str
    family: str
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return BUILTIN / self.file


# One line per bundled suite (`--tasks builtin:NAME`): its rows file plus its one-line description.
SUITES = Registry(
    "bundled suite",
    {
        "starter": Entry(
            Suite("starter/tasks.jsonl", "swe"),
            "small Python packages with real bugs; hidden tests fail before the fix",
        ),
        "search": Entry(
            Suite("search_qa/questions.jsonl", "search", {"corpus": "corpus.jsonl"}),
            "questions about an invented archipelago, answered by searching its corpus",
        ),
        "lookup": Entry(
            Suite("lookup/chain.jsonl", "lookup"),
            "RL: cat note.txt, cat the file it names, finish with its random code (3 tool turns)",
        ),
        "harbor": Entry(
            Suite("harbor", "harbor"),
            "Harbor task directories: a file edit, a service's config, a pytest-graded program",
        ),
        "lookup-easy": Entry(
            Suite("lookup/easy.jsonl", "lookup"),
            "RL, short: read the named file, then finish with its random code (2 tool turns)",
        ),
    },
)


def family_class(name: str) -> type[Task]:
    """The Task class of family `name`; an unknown one is a ConfigError listing them."""
    cls: type[Task] = FAMILIES.load(name)
    return cls


def detect_family(row: dict[str, Any]) -> str:
    """The family a row belongs to, from its own `family` field or the fields it has."""
    if row.get("family"):
        return str(row["family"])
    if "install_config" in row:
        return "swe_rebench"
    if "expected_output_json" in row or "parsed_commit_content" in row or "docker_image" in row:
        return "r2e_gym"
    if "FAIL_TO_PASS" in row or "patch" in row:
        return "swe"
    if "question" in row:
        return "search"
    raise ConfigError(f"cannot tell the task family of a row with fields {sorted(row)[:12]}; add `family`")


def resolve_suite(spec: str) -> tuple[Path, str | None, dict[str, Any]]:
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in SUITES:
            raise SUITES.unknown(spec, ", ".join("builtin:" + s for s in SUITES))
        suite: Suite = SUITES.load(name)
        return suite.path, suite.family, dict(suite.defaults)
    if spec.startswith("harbor:"):
        return Path(spec.split(":", 1)[1]), "harbor", {}
    return Path(spec), None, {}


def read_rows(path: Path, family: str | None) -> list[dict[str, Any]]:
    """A suite's rows: a rows file, or for Harbor one row per task directory."""
    if family == "harbor":
        from uniagent.tasks.harbor_config import task_rows

        return task_rows(path)
    return load_rows(path)


SuiteSpec = SUITES.field_type(resolve_suite)
"""A config's `tasks.spec`: `builtin:NAME` is checked against `SUITES` when the config is built (a
file is checked when it is read)."""


def load_tasks(
    spec: str, family: str | None = None, limit: int | None = None, ids: list[str] | None = None
) -> list[Task]:
    """`builtin:starter`, `harbor:DIR`, or a task file; `family` overrides detection."""
    path, suite_family, defaults = resolve_suite(spec)
    rows = read_rows(path, family or suite_family)
    tasks: list[Task] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        row = {**defaults, **row}
        fam = family or suite_family or detect_family(row)
        try:
            task = family_class(fam).from_row(row, source=str(path))
        except ConfigError as exc:
            raise ConfigError(f"{path} row {i}: {exc}") from None
        if not task.instance_id:
            raise ConfigError(f"{path} row {i}: no instance_id (or id)")
        if task.instance_id in seen:
            raise ConfigError(f"{path}: duplicate instance_id {task.instance_id!r}")
        seen.add(task.instance_id)
        if ids and task.instance_id not in ids:
            continue
        tasks.append(task)
    if ids:
        missing = sorted(set(ids) - {t.instance_id for t in tasks})
        if missing:
            raise ConfigError(f"{path}: no task with id {', '.join(missing)}")
    return tasks[:limit] if limit else tasks
