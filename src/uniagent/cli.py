"""The `uniagent` command."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from uniagent import __version__
from uniagent.agent.registry import AGENTS
from uniagent.errors import RunInterruptedError, UniAgentError
from uniagent.models.registry import kinds_help
from uniagent.models.tokens_cli import tokens_app
from uniagent.runner.config import RUN_BACKENDS
from uniagent.runner.make_cli import make_command
from uniagent.sandbox.registry import BACKENDS

app = typer.Typer(
    help="uniagent: run LLM agents at scale and train them with verl, token-exact.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


@app.command()
def version() -> None:
    """Print the uniagent version."""
    console.print(f"uniagent {__version__}")


@app.command()
def demo(
    model: str = typer.Option(
        "local", help=f"a token-level model spec (local: the packaged SmolLM2): {kinds_help()}"
    ),
    turns: int = typer.Option(3, min=1, help="most model turns"),
    max_tokens: int = typer.Option(96, min=1, help="most tokens per turn"),
    seed: int = typer.Option(0, help="sampling seed"),
    temperature: float = typer.Option(0.7, min=0.0, help="sampling temperature"),
    show_tokens: bool = typer.Option(True, help="print the response tokens coloured by mask"),
) -> None:
    """Run one short token-level episode (the local model by default) and show its trajectory."""
    from uniagent.demo import run_demo

    console.print(f"[bold]uniagent demo[/] — model {model!r}, {turns} turns, {max_tokens} tokens/turn (CPU)")
    result = asyncio.run(
        run_demo(model=model, turns=turns, max_tokens=max_tokens, seed=seed, temperature=temperature)
    )
    for message in result.messages:
        body = str(message.get("content") or "")
        calls = message.get("tool_calls")
        console.print(
            f"[cyan]{message['role']:>9}[/] {body[:300]!r}" + (f" tool_calls={calls}" if calls else "")
        )
    traj = result.trajectory
    summary = traj.summary()
    table = Table(title="trajectory (what the trainer receives)")
    counts = ("prompt_tokens", "response_tokens", "model_tokens", "context_tokens", "num_turns")
    for key in (*counts, "drift", "drift_kind"):  # kind: sampled (harmless) or bookkeeping (a bug)
        table.add_row(key, str(summary[key]))
    model_lp = [lp for lp, m in zip(traj.response_logprobs, traj.response_mask, strict=True) if m]
    table.add_row("mean logprob (model tokens)", f"{sum(model_lp) / max(len(model_lp), 1):.3f}")
    table.add_row("tool calls / format errors", f"{result.tool_calls} / {result.format_errors}")
    table.add_row("finish reasons", ", ".join(traj.finish_reasons))
    table.add_row("wall time", f"{result.seconds:.1f} s")
    console.print(table)
    if show_tokens:
        tok = result.tokenizer
        text = Text()
        for token_id, mask in zip(traj.response_ids, traj.response_mask, strict=True):
            piece = tok.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            text.append(piece, style="bold green" if mask else "dim")
        console.print("response tokens ([bold green]model, mask 1[/], [dim]context, mask 0[/]):")
        console.print(text)


tasks_app = typer.Typer(help="Describe task suites and files.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


@tasks_app.command("list")
def tasks_list() -> None:
    """List the bundled suites (use them as `--tasks builtin:NAME`)."""
    from uniagent.tasks.registry import SUITES, read_rows

    table = Table(title="bundled task suites")
    for col in ("suite", "family", "tasks", "description"):
        table.add_column(col)
    for name, entry in SUITES.items():
        suite = SUITES.load(name)
        n = len(read_rows(suite.path, suite.family)) if suite.path.exists() else 0
        table.add_row(f"builtin:{name}", suite.family, str(n), entry.help)
    console.print(table)


@tasks_app.command("show")
def tasks_show(
    suite: str = typer.Argument(..., help="builtin:NAME, harbor:DIR or a task file"),
    instance: str | None = typer.Argument(None, help="one instance id: show its full row"),
) -> None:
    """List a suite's tasks, or show one task."""
    from uniagent.tasks import load_tasks

    tasks = load_tasks(suite, ids=[instance] if instance else None)
    if instance:
        row = tasks[0].row
        for key, value in row.items():
            text = value if isinstance(value, str) else repr(value)
            console.print(f"[bold cyan]{key}[/]:\n{text}\n")
        return
    table = Table(title=f"{suite}: {len(tasks)} tasks")
    for col in ("instance_id", "family", "summary"):
        table.add_column(col)
    for t in tasks:
        text = str(t.row.get("problem_statement") or t.row.get("question") or t.row.get("task") or "")
        table.add_row(t.instance_id, t.family, " ".join(text.split())[:90])
    console.print(table)


tasks_app.command("make")(make_command)
app.add_typer(tokens_app, name="tokens")


@app.command()
def verify(
    tasks: str = typer.Option(
        ..., "--tasks", help="builtin:starter, harbor:DIR or a task file (JSONL, JSON, parquet)"
    ),
    predictions: Path | None = typer.Option(
        None, help="SWE-bench predictions JSONL (instance_id, model_patch)"
    ),
    output: Path = typer.Option(Path("verify_out"), help="where report.json goes"),
    gold: bool = typer.Option(
        False, "--gold", help="grade the rows' own gold patches (Harbor: solution/solve.sh)"
    ),
    concurrency: int = typer.Option(4, min=1, help="sandboxes at once"),
    sandbox: str = typer.Option(
        "local", help=f"sandbox type for rows without an image: {' | '.join(BACKENDS)}"
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="sandbox setting, e.g. sandbox.runtime=podman (with --sandbox container)"
    ),
) -> None:
    """Grade predictions in sandboxes and write DIR/report.json."""
    from rich.progress import Progress

    from uniagent.config import set_dotted
    from uniagent.sandbox.config import parse_config
    from uniagent.tasks import load_tasks
    from uniagent.tasks.harbor import HarborTask
    from uniagent.tasks.swe import SweTask
    from uniagent.tasks.verify import load_predictions
    from uniagent.tasks.verify import verify as run_verify

    if gold == (predictions is not None):
        raise UniAgentError("give either --predictions FILE or --gold")
    loaded = load_tasks(tasks)
    swe = [t for t in loaded if isinstance(t, SweTask | HarborTask)]
    if not swe:
        raise UniAgentError(f"{tasks} has no SWE-style or Harbor tasks to verify")
    settings: dict[str, Any] = {"sandbox": {"type": sandbox}}
    for item in set_:
        key, sep, raw = item.partition("=")
        if not sep or not key.startswith("sandbox."):
            raise UniAgentError(f"--set {item}: verify takes sandbox.KEY=VALUE")
        set_dotted(settings, key, raw)
    sandbox_cfg = parse_config(settings["sandbox"])  # once: every task completes this one
    preds = load_predictions(predictions) if predictions is not None else None
    total = len(preds) if preds is not None else len(swe)
    with Progress(console=console, transient=True) as bar:
        job = bar.add_task("grading", total=total)
        report = asyncio.run(
            run_verify(swe, preds, output, concurrency, sandbox_cfg, lambda r: bar.advance(job))
        )
    table = Table(title=f"verify: {tasks}")
    for key in ("submitted_instances", "resolved_instances", "unresolved_instances", "error_instances"):
        table.add_row(key, str(report[key]))
    table.add_row("seconds", str(report["seconds"]))
    console.print(table)
    for iid in report["error_ids"]:
        console.print(f"[yellow]error[/] {iid}: {report['instances'][iid].get('error', '')[:200]}")
    console.print(f"report: {output / 'report.json'}")


@app.command()
def run(
    tasks: str | None = typer.Option(None, help="builtin:NAME, harbor:DIR or a task file"),
    model: str | None = typer.Option(None, help=f"model spec: {kinds_help()}"),
    sandbox: str | None = typer.Option(None, help=BACKENDS.choices()),
    concurrency: int | None = typer.Option(None, min=1, help="episodes at once"),
    samples: int | None = typer.Option(None, min=1, help="episodes per task"),
    max_turns: int | None = typer.Option(None, min=1, help="model turns per episode"),
    limit: int | None = typer.Option(None, min=1, help="run only the first N tasks"),
    output: Path | None = typer.Option(None, help="run directory (store, exports)"),
    resume: bool = typer.Option(False, "--resume", help="continue the run in --output"),
    agent: str | None = typer.Option(None, help=AGENTS.choices()),
    backend: str | None = typer.Option(None, help=RUN_BACKENDS.choices()),
    ray_address: str | None = typer.Option(None, help="Ray cluster address (backend ray)"),
    config: Path | None = typer.Option(None, "--config", help="a YAML run config"),
    set_: list[str] = typer.Option([], "--set", help="dotted override, e.g. model.temperature=0.7"),
) -> None:
    """Run episodes concurrently, store each as it ends, and export the results."""
    from uniagent.runner import build_config
    from uniagent.runner.interrupt import resume_command
    from uniagent.runner.live import run_with_progress

    flags = {
        "tasks.spec": tasks,
        "model.spec": model,
        "sandbox.type": sandbox,
        "runner.concurrency": concurrency,
        "runner.samples": samples,
        "agent.max_turns": max_turns,
        "tasks.limit": limit,
        "runner.output": str(output) if output else None,
        "runner.resume": True if resume else None,
        "runner.backend": backend,
        "agent.kind": agent,
        "runner.ray_address": ray_address,
    }
    cfg = build_config(config, set_, flags)
    run_with_progress(cfg, console, resume_command())


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="a run directory (uniagent run --output) or its run.db"),
    parquet: bool = typer.Option(False, "--parquet", help="also write segments.parquet (needs pyarrow)"),
) -> None:
    """Write a run's exports again from its store: results.jsonl, preds.jsonl, summary.json and
    segments.jsonl (one training record per segment), plus segments.parquet with --parquet."""
    from uniagent.runner.export import write_segments_parquet
    from uniagent.runner.store import RunStore, store_path
    from uniagent.runner.summary import export as export_run

    db = store_path(run_dir)
    store = RunStore(db)
    try:
        model = (store.meta("config", {}) or {}).get("model") or {}
        summary = export_run(store, db.parent, str(model.get("name") or model.get("spec") or "unknown"))
        written = ["results.jsonl", "preds.jsonl", "segments.jsonl", "summary.json"]
        if parquet:
            write_segments_parquet(store, db.parent)
            written.append("segments.parquet")
    finally:
        store.close()
    console.print(f"{summary['episodes']} episodes exported to {db.parent}: {', '.join(written)}")


@app.command()
def doctor(
    model: list[str] = typer.Option(
        [], "--model", help=f"also check this model, any spec: {kinds_help()} (repeatable)"
    ),
    quick: bool = typer.Option(False, "--quick", help="local models: tokenizer only, no weight load"),
) -> None:
    """Check, by using them, which engines and sandbox backends work here, and why not.

    Exits 1 when the default path (the local model and the local sandbox) or a model given
    with --model is broken; missing optional parts are warnings.
    """
    from uniagent.doctor import run_checks

    table = Table(title="uniagent doctor")
    for col in ("component", "status", "detail"):
        table.add_column(col)
    style = {"ok": "green", "FAIL": "bold red", "warn": "yellow", "n/a": "dim"}
    checks = asyncio.run(run_checks(model, quick=quick))
    for check in checks:
        table.add_row(check.name, f"[{style[check.status]}]{check.status}[/]", check.detail)
    console.print(table)
    failed = [c.name for c in checks if c.status == "FAIL"]
    if failed:
        console.print(f"[bold red]broken:[/] {', '.join(failed)}")
        raise typer.Exit(1)
    warned = sum(c.status == "warn" for c in checks)
    note = f"; {warned} optional part(s) broken" if warned else ""
    console.print(f"[green]the default path works[/]{note}")


# Commands that live with their subsystem: each module has `register(app)`, and imports its
# heavy dependencies (verl, torch training, web servers) only when its command runs.
COMMAND_MODULES = (
    "uniagent.integrations.verl.cli",
    "uniagent.train.cli",
    "uniagent.gateway.cli",
    "uniagent.dashboard.cli",
)


def _register_commands() -> None:
    import importlib

    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that subsystem is not built in this checkout
            raise
        module.register(app)


_register_commands()


def main() -> None:
    """Entry point: user mistakes print one clear line and exit 2, without a traceback; a run
    stopped by SIGTERM/SIGINT says how to resume and exits 128 + the signal (143, 130)."""
    try:
        app()
    except RunInterruptedError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        sys.exit(exc.exit_status)
    except UniAgentError as exc:
        # Plain print: one line, never wrapped to the terminal width, easy to grep.
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
