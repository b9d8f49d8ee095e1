"""The uniagent task spec a verl dataset row carries, and the Task it rebuilds.

A verl row holds the prompt as chat messages plus `extra_info`; uniagent puts the whole task there
(family, the row as loaded, where it came from) so the agent loop builds exactly the Task that
`uniagent run` builds from the same file. The row travels as a JSON string: task rows of different
families have different fields and types, which a parquet struct column cannot hold side by side.
Bundled suites are stored by name (`builtin:starter`), not by path, so a dataset prepared on one
machine resolves the suite's files on another.
"""

from __future__ import annotations

import json
from typing import Any

from uniagent.errors import ConfigError
from uniagent.tasks.base import Task

SPEC_KEY = "uniagent_task"


def task_spec(task: Task, source: str) -> dict[str, Any]:
    """What `extra_info[SPEC_KEY]` holds (decoded): enough to rebuild `task` anywhere."""
    return {"family": task.family, "instance_id": task.instance_id, "source": source, "row": task.row}


def encode_spec(spec: dict[str, Any]) -> str:
    return json.dumps(spec, ensure_ascii=False, default=str)


def resolve_source(source: str | None) -> str | None:
    """`builtin:NAME` -> the suite file on this machine; a path stays as it is."""
    if source and source.startswith("builtin:"):
        from uniagent.tasks.registry import resolve_suite

        return str(resolve_suite(source)[0])
    return source


def spec_from_extra_info(extra_info: Any) -> dict[str, Any]:
    """The task spec in a dataset row's `extra_info` (a dict, or its JSON string)."""
    if isinstance(extra_info, str):
        extra_info = json.loads(extra_info)
    if not isinstance(extra_info, dict) or SPEC_KEY not in extra_info:
        raise ConfigError(
            f"the dataset row has no extra_info.{SPEC_KEY}; prepare the data with `uniagent data prepare`"
        )
    raw = extra_info[SPEC_KEY]
    spec = json.loads(raw) if isinstance(raw, str) else dict(raw)
    missing = {"family", "row"} - set(spec)
    if missing:
        raise ConfigError(f"extra_info.{SPEC_KEY} lacks {', '.join(sorted(missing))}")
    return spec


def task_from_spec(spec: dict[str, Any]) -> Task:
    """The Task `uniagent run` would build from the same row and source."""
    from uniagent.tasks.registry import family_class

    # Rows with relative paths (repo_dir) resolve them against the source file; rows that name a
    # container image need no file, so a source missing on this node is not an error here.
    source = resolve_source(spec.get("source"))
    return family_class(str(spec["family"])).from_row(dict(spec["row"]), source=source)
