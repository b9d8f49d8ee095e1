# ruff: noqa: B008  (Typer declares options as call defaults; that is its documented API)
"""`uniagent tokens check`: a tokenizer + chat template as the codec sees it (models/token_report.py
builds the report), as a table or JSON, so a user learns before training what the codec will do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

console = Console()

tokens_app = typer.Typer(
    help="Inspect a tokenizer's chat template as the codec sees it.", no_args_is_help=True
)


@tokens_app.command("check")
def tokens_check(
    spec: str = typer.Argument(..., help="a tokenizer folder, a model directory, a .gguf file, or local"),
    template: Path | None = typer.Option(
        None, help="a Jinja chat template file (default: the tokenizer's own)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Report a tokenizer + template's end-of-turn tokens, BOS handling, whether the template is
    append-only / stateful / rewriting, and what the codec will do: learn it before training."""
    from uniagent.models.token_report import token_report

    report = token_report(spec, template)
    if as_json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return
    table = Table(title=f"tokens check: {report['tokenizer']} (template: {report['template']})")
    table.add_column("fact")
    table.add_column("value")

    def ids(key: str) -> str:
        return ", ".join(f"{t['text']} ({t['id']})" for t in report[key]) or "-"

    colour = {"append_only": "green", "stateful": "yellow", "rewriting": "yellow", "refused": "red"}
    rows = [
        ("end of turn", ids("end_of_turn")),
        ("end of the last turn", ids("final_end_of_turn")),
        ("stop token ids", str(report["stop_token_ids"])),
        ("tokenizer eos_token (not used)", str(report["eos_token"])),
        ("boundary after end of turn", repr(report["boundary"])),
        ("generation prompt", repr(report["generation_prompt"])),
        ("BOS", report["bos"]),
        ("renders tool calls / tool role", f"{report['renders_tool_calls']} / {report['renders_tool_role']}"),
        (
            "template",
            f"[{colour[report['kind']]}]{report['kind']}[/]"
            + (f" (on a {report['decided_on']} conversation)" if report["decided_on"] else ""),
        ),
        ("reply's message", _reply(report)),
        ("why", report["reason"]),
        ("codec", f"[bold]{report['codec_action']}[/]"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def _reply(report: dict[str, Any]) -> str:
    """Where a reply's answer and reasoning go (tokens/reply.py)."""
    head, field = report["reply_head"], report["reasoning_field"]
    said = f"content after {head!r}" if head else "content = the reply's text"
    return f"{said}, reasoning in {field!r}" if field else said
