"""Dataset rows from JSONL, JSON, parquet, or a Hugging Face `datasets.load_from_disk` folder."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from uniagent.errors import ConfigError


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"task file {p} does not exist")
    if p.is_dir():
        return _load_hf(p)
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{p}:{n}: not valid JSON ({exc.msg})") from None
        return _check(rows, p)
    if suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if isinstance(data, dict):
            data = data.get("rows") or data.get("data") or data.get("instances")
        if not isinstance(data, list):
            raise ConfigError(f"{p}: expected a JSON list of rows (or an object with `rows`)")
        return _check(data, p)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return _check(pq.read_table(p).to_pylist(), p)
    raise ConfigError(
        f"{p}: unknown task file type {suffix!r} (use .jsonl, .json, .parquet or a dataset folder)"
    )


def _load_hf(p: Path) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{p} is a folder: loading it needs the `datasets` package") from None
    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        split = "test" if "test" in ds else next(iter(ds))
        ds = ds[split]
    return _check([dict(r) for r in ds], p)


def _check(rows: list[Any], p: Path) -> list[dict[str, Any]]:
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"{p}: row {i} is a {type(row).__name__}, not an object")
    return rows


def json_field(value: Any, field: str, *, literals: bool = False) -> Any:
    """A row field that datasets store either as the value itself or as its JSON text (SWE-bench's
    test lists in some releases, R2E-Gym's commit objects); with `literals`, Python literal text
    too (SWE-rebench V2 samples). Blank text is `None`. One reading for every task family."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if not literals:
            raise ConfigError(f"{field} is a string but not valid JSON") from None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ConfigError(f"{field} is a string but neither JSON nor a Python literal") from None


def json_list(value: Any, field: str, *, literals: bool = False) -> list[str]:
    """A list of test ids, stored as a list or as its text (`json_field`); none is an empty list."""
    value = json_field(value, field, literals=literals)
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{field} must be a list of test ids")
    return [str(v) for v in value]
