"""`uniagent run`'s live view: a rich progress bar in a terminal; plain lines everywhere else.

Without a terminal (CI, nohup, a cluster job's log) a redrawn bar prints nothing until the end,
so there the run prints one plain, greppable line every `runner.progress_interval_s` seconds
and at each 10% of the episodes, whether or not an episode finished in between.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from uniagent.runner.config import RunConfig
from uniagent.runner.run import Progress as RunProgress
from uniagent.runner.run import Runner
from uniagent.sandbox.config import type_of


def _line(p: RunProgress) -> str:
    exits = " ".join(f"{k}={v}" for k, v in sorted(p.exits.items()))
    eta = f"{p.eta_s:.0f}s" if p.eta_s is not None else "?"
    return f"resolved {p.resolved}  {p.tokens_per_s:.1f} tok/s  ETA {eta}  {exits}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def plain_line(p: RunProgress) -> str:
    """One ASCII line (log files and C locales take it as is)."""
    exits = " ".join(f"{k}={v}" for k, v in sorted(p.exits.items())) or "none yet"
    eta = _duration(p.eta_s) if p.eta_s is not None else "?"
    return (
        f"[{time.strftime('%H:%M:%S')}] {p.done}/{p.total} done | {p.resolved} resolved | "
        f"{p.episodes_per_min:.1f} ep/min | exits {exits} | elapsed {_duration(p.elapsed)} | eta {eta}"
    )


class PlainProgress:
    """Prints `plain_line` at each 10% milestone (from the runner's callback) and on a timer."""

    def __init__(self, console: Console, interval_s: float) -> None:
        self.console = console
        self.interval_s = interval_s
        self.last: RunProgress | None = None
        self.milestone = -1
        self.printed_at = time.monotonic()

    def emit(self, p: RunProgress) -> None:
        print(plain_line(p), file=self.console.file, flush=True)
        self.printed_at = time.monotonic()

    def update(self, p: RunProgress) -> None:
        self.last = p
        tenth = p.done * 10 // p.total if p.total else 10
        if tenth > self.milestone:
            self.milestone = tenth
            self.emit(p)

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, self.printed_at + self.interval_s - time.monotonic()))
            if self.last is not None and time.monotonic() - self.printed_at >= self.interval_s:
                self.emit(self.last)


async def _run_plain(runner: Runner, plain: PlainProgress) -> dict[str, Any]:
    ticker = asyncio.create_task(plain.tick())
    try:
        return await runner.run()
    finally:
        ticker.cancel()


def run_with_progress(cfg: RunConfig, console: Console, resume_command: str | None = None) -> dict:
    """The run with its live view. `resume_command`: the exact line that continues it, printed if a
    signal stops it (the CLI's invocation plus --resume)."""
    console.print(
        f"[bold]uniagent run[/] tasks={cfg.tasks.spec} model={cfg.model.spec} "
        f"sandbox={type_of(cfg.sandbox)} concurrency={cfg.runner.concurrency} "
        f"samples={cfg.runner.samples} -> {cfg.runner.output}",
        soft_wrap=True,  # one line in a log, whatever the width
    )
    if not console.is_terminal:
        plain = PlainProgress(console, cfg.runner.progress_interval_s)
        summary = asyncio.run(_run_plain(Runner(cfg, plain.update, resume_command), plain))
    else:
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

            summary = asyncio.run(Runner(cfg, update, resume_command).run())
    table = Table(title="run summary")
    table.add_column("figure")
    table.add_column("value")
    for key, value in summary.items():
        table.add_row(key, str(value))
    console.print(table)
    out = cfg.runner.output
    console.print(
        f"results: {out}/results.jsonl  predictions: {out}/preds.jsonl  summary: {out}/summary.json",
        soft_wrap=True,
    )
    console.print(f"store: {out}/run.db (resume with --resume --output {out})", soft_wrap=True)
    return summary
