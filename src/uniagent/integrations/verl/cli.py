# ruff: noqa: B008  (Typer declares options as call defaults; that is its documented API)
"""CLI commands of the verl integration: `uniagent data prepare` and `uniagent verl ...`.

`uniagent.cli` calls `register(app)` on every start, so nothing heavy is imported here: pyarrow,
verl and the task families load inside the command bodies.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def train_verl(config: str | None, overrides: list[str], print_only: bool) -> None:
    """`uniagent train --engine verl`: launch (or print) verl's trainer on a recipe."""
    from uniagent.errors import UniAgentError

    try:
        from uniagent.integrations.verl import launch
    except ModuleNotFoundError as exc:
        raise UniAgentError(
            f"--engine verl needs uniagent.integrations.verl.launch, which is not available here ({exc}); "
            "use --engine local, or install/update uniagent with the verl integration"
        ) from None
    if config is None:
        raise UniAgentError("--engine verl needs --config RECIPE")
    if print_only:
        typer.echo(launch.shell_line(config, list(overrides)))
        return
    code = launch.launch(config, list(overrides))
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the `data` and `verl` command groups to the `uniagent` app, and `verl` as an engine
    of `uniagent train`."""
    from uniagent.tasks.registry import FAMILIES
    from uniagent.train.cli import ENGINES

    ENGINES["verl"] = train_verl
    data_app = typer.Typer(help="Turn task files into training data.", no_args_is_help=True)
    verl_app = typer.Typer(help="Train with verl: recipes and their launch commands.", no_args_is_help=True)
    app.add_typer(data_app, name="data")
    app.add_typer(verl_app, name="verl")

    @data_app.command("prepare")
    def data_prepare(
        tasks: str = typer.Option(
            ..., "--tasks", help="builtin:starter or a task file (JSONL, JSON, parquet)"
        ),
        output: Path = typer.Option(Path("data/verl/starter"), help="directory for train/val parquet"),
        val_fraction: float = typer.Option(0.1, min=0.0, max=0.99, help="share of tasks for validation"),
        val_size: int | None = typer.Option(None, min=0, help="exact validation size (overrides fraction)"),
        seed: int = typer.Option(0, help="seed of the train/validation shuffle"),
        agent_name: str = typer.Option("uniagent", help="agent-loop entry that runs the rows"),
        data_source: str | None = typer.Option(None, help="verl data_source (default uniagent/FAMILY)"),
        family: str | None = typer.Option(
            None, help=f"task family, when it cannot be detected: {' | '.join(FAMILIES)}"
        ),
        limit: int | None = typer.Option(None, min=1, help="only the first N tasks"),
        ids: list[str] | None = typer.Option(None, "--id", help="only these task ids (repeat the flag)"),
    ) -> None:
        """Write verl parquet files (prompt, agent_name, data_source, reward_model, extra_info)."""
        from uniagent.integrations.verl.data import prepare

        report = prepare(
            tasks,
            output,
            val_fraction=val_fraction,
            val_size=val_size,
            seed=seed,
            agent_name=agent_name,
            data_source=data_source,
            family=family,
            limit=limit,
            ids=ids,
        )
        console.print(f"train: {report['n_train']} rows -> {report['train']}")
        console.print(f"val:   {report['n_val']} rows -> {report['val']}")

    @verl_app.command("recipes")
    def verl_recipes() -> None:
        """List the launch recipes in recipes/verl/."""
        from uniagent.integrations.verl.launch import available_recipes, load_recipe

        table = Table(title="verl recipes")
        for col in ("recipe", "entrypoint", "description"):
            table.add_column(col)
        for name in available_recipes():
            recipe = load_recipe(name)
            table.add_row(name, recipe["entrypoint"], str(recipe.get("description", "")))
        console.print(table)

    @verl_app.command("command", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def verl_command(
        ctx: typer.Context,
        recipe: str = typer.Argument(..., help="recipe name or YAML file"),
    ) -> None:
        """Print the exact python -m verl... command for RECIPE plus hydra overrides."""
        from uniagent.integrations.verl.launch import shell_line

        print(shell_line(recipe, list(ctx.args)))

    @verl_app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def verl_launch(
        ctx: typer.Context,
        recipe: str = typer.Argument(..., help="recipe name or YAML file"),
    ) -> None:
        """Run RECIPE with verl (hydra overrides after the recipe); exits with verl's status."""
        from uniagent.integrations.verl.launch import launch, shell_line

        console.print(shell_line(recipe, list(ctx.args)), markup=False, highlight=False)
        raise typer.Exit(launch(recipe, list(ctx.args)))
