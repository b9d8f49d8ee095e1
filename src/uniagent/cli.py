"""The `uniagent` command."""

from __future__ import annotations

import asyncio
import sys

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from uniagent import __version__
from uniagent.errors import UniAgentError

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
    model: str = typer.Option("local", help="`local` (packaged SmolLM2), a model directory or a .gguf file"),
    turns: int = typer.Option(3, min=1, help="most model turns"),
    max_tokens: int = typer.Option(96, min=1, help="most tokens per turn"),
    seed: int = typer.Option(0, help="sampling seed"),
    temperature: float = typer.Option(0.7, min=0.0, help="sampling temperature"),
    show_tokens: bool = typer.Option(True, help="print the response tokens coloured by mask"),
) -> None:
    """Run one short token-level episode with the local model and show its trajectory."""
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
    for key in ("prompt_tokens", "response_tokens", "model_tokens", "context_tokens", "num_turns", "drift"):
        table.add_row(key, str(summary[key]))
    model_lp = [lp for lp, m in zip(traj.response_logprobs, traj.response_mask, strict=True) if m]
    table.add_row("mean logprob (model tokens)", f"{sum(model_lp) / max(len(model_lp), 1):.3f}")
    table.add_row("tool calls / format errors", f"{result.tool_calls} / {result.format_errors}")
    table.add_row("finish reasons", ", ".join(traj.finish_reasons))
    table.add_row("wall time", f"{result.seconds:.1f} s")
    console.print(table)
    if show_tokens:
        from uniagent.models.loading import load_tokenizer, resolve_model

        tok = load_tokenizer(resolve_model(model))
        text = Text()
        for token_id, mask in zip(traj.response_ids, traj.response_mask, strict=True):
            piece = tok.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            text.append(piece, style="bold green" if mask else "dim")
        console.print("response tokens ([bold green]model, mask 1[/], [dim]context, mask 0[/]):")
        console.print(text)


def main() -> None:
    """Entry point: user mistakes print one clear line and exit 2, without a traceback."""
    try:
        app()
    except UniAgentError as exc:
        Console(stderr=True).print(f"[red]error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
