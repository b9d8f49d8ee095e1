"""`uniagent run`'s live view: a rich progress bar with the figures that matter mid-run."""

from __future__ import annotations

import asyncio

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from uniagent.runner.config import RunConfig
from uniagent.runner.run import Progress as RunProgress
from uniagent.runner.run import Runner


def _line(p: RunProgress) -> str:
    exits = " ".join(f"{k}={v}" for k, v in sorted(p.exits.items()))
    eta = f"{p.eta_s:.0f}s" if p.eta_s is not None else "?"
    return f"resolved {p.resolved}  {p.tokens_per_s:.1f} tok/s  ETA {eta}  {exits}"


def run_with_progress(cfg: RunConfig, console: Console) -> dict:
    console.print(
        f"[bold]uniagent run[/] tasks={cfg.tasks.spec} model={cfg.model.spec} "
        f"sandbox={cfg.sandbox.get('type', 'local')} concurrency={cfg.runner.concurrency} "
        f"samples={cfg.runner.samples} -> {cfg.runner.output}"
    )
    with Progress(
        TextColumn("[bold blue]episodes"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=False,
    ) as bar:
        job = bar.add_task("starting", total=None)

        def update(p: RunProgress) -> None:
            bar.update(job, total=p.total, completed=p.done, description=_line(p))

        summary = asyncio.run(Runner(cfg, update).run())
    table = Table(title="run summary")
    table.add_column("figure")
    table.add_column("value")
    for key, value in summary.items():
        table.add_row(key, str(value))
    console.print(table)
    out = cfg.runner.output
    console.print(
        f"results: {out}/results.jsonl  predictions: {out}/preds.jsonl  summary: {out}/summary.json"
    )
    console.print(f"store: {out}/run.db (resume with --resume --output {out})")
    return summary
