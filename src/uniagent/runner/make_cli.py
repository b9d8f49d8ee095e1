# ruff: noqa: B008  (Typer declares options as call defaults; that is its documented API)
"""`uniagent tasks make`: the command line of `uniagent.tasks.make` (flags, progress, summary), with
the difficulty filter of `uniagent.runner.difficulty` (it runs episodes, hence this layer)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from uniagent.errors import ConfigError

console = Console()


def make_command(
    source: Path = typer.Argument(..., help="a git repository (its HEAD is used) or a source tree"),
    test_cmd: str = typer.Option(
        ...,
        "--test-cmd",
        help="runs the tests from the tree's root; pytest with -rA, e.g. 'python -m pytest -rA tests'",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="where tasks.jsonl and the tasks' repository go"),
    workers: int = typer.Option(2, "--workers", min=1, help="sandboxes running tests at once"),
    max_candidates: int = typer.Option(50, "--max-candidates", min=1, help="candidate bugs to try"),
    seed: int = typer.Option(0, "--seed", help="which candidates, in which order"),
    work: Path | None = typer.Option(None, "--work", help="work dir (default OUT/work); a rerun resumes"),
    paths: list[str] = typer.Option([], "--path", help="only put bugs in files under this (repeatable)"),
    timeout_s: float | None = typer.Option(
        None, "--timeout-s", help="per test run (default: 5x baseline + 30)"
    ),
    prefix: str | None = typer.Option(None, "--prefix", help="instance id prefix (default: folder name)"),
    statement_model: str | None = typer.Option(
        None, "--statement-model", help="a model that writes the problem statements, e.g. openai:URL"
    ),
    pack: bool = typer.Option(False, "--pack", help="pack the repository as OUT/repo.tar.gz for the rows"),
    filter_k: int | None = typer.Option(None, "--filter-k", min=1, help="drop rows --model solves k/k, 0/k"),
    model: str | None = typer.Option(None, "--model", help="the model of --filter-k (a model spec)"),
    sandbox: str = typer.Option("local", "--sandbox", help="sandbox type the tests run in"),
) -> None:
    """Make validated SWE tasks from a Python repository: inject bugs, keep those its tests catch."""
    from uniagent.tasks import made_rows
    from uniagent.tasks.make import MakeConfig, make

    if (filter_k is None) != (model is None):
        raise ConfigError("--filter-k and --model go together")
    cfg = MakeConfig(
        source=source,
        test_cmd=test_cmd,
        out=out,
        work=work,
        workers=workers,
        max_candidates=max_candidates,
        seed=seed,
        paths=paths,
        timeout_s=timeout_s,
        prefix=prefix,
        statement_model=statement_model,
        sandbox={"type": sandbox},
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        job = bar.add_task("baseline tests", total=None)
        kept = 0

        def started(total: int, done: int) -> None:
            bar.update(job, description="candidates (kept 0)", total=total, completed=done)

        def progress(res: dict[str, Any]) -> None:
            nonlocal kept
            kept += bool(res.get("kept"))
            bar.update(job, advance=1, description=f"candidates (kept {kept})")

        summary = asyncio.run(make(cfg, progress, started))
    if filter_k is not None and model is not None:
        from uniagent.runner.difficulty import filter_rows

        summary["filter"] = asyncio.run(filter_rows(cfg.out, model, filter_k, {"type": sandbox}))
    if pack:
        made_rows.pack(cfg.out)
    table = Table(title=f"tasks make: {source}")
    for key in ("candidates", "valid", "kept", "baseline_tests", "seconds"):
        table.add_row(key, str(summary[key]))
    for why, n in sorted(summary["rejected"].items()):
        table.add_row(f"rejected: {why}", str(n))
    if summary["gold_not_resolved"]:
        table.add_row("dropped: gold patch not resolved", str(len(summary["gold_not_resolved"])))
    if "filter" in summary:
        table.add_row("after --filter-k", str(summary["filter"]["kept"]))
    console.print(table)
    tasks = summary["tasks"]
    console.print(f"tasks: {tasks}  (check them: uniagent verify --tasks {tasks} --gold)")
