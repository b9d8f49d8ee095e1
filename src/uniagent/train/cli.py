"""The `uniagent train` command: `--engine local` trains here, `--engine verl` hands off to verl.

Kept import-light: `uniagent --help` must not pay for torch or verl, so everything heavy is
imported inside the command body.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from uniagent.errors import UniAgentError


def _verl_launch():
    """The verl launcher, or a clear error when that integration is not in this checkout."""
    try:
        from uniagent.integrations.verl import launch
    except ModuleNotFoundError as exc:
        raise UniAgentError(
            f"--engine verl needs uniagent.integrations.verl.launch, which is not available here ({exc}); "
            "use --engine local, or install/update uniagent with the verl integration"
        ) from None
    return launch


def train(
    engine: Annotated[
        str, typer.Option(help="local: train in this process | verl: launch verl's trainer")
    ] = "local",
    config: Annotated[
        Path | None,
        typer.Option("--config", help="YAML train config (local), or a verl recipe file or name (verl)"),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="dotted override, e.g. algo.loss_mode=gspo")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue from the latest checkpoint in the output")
    ] = False,
    print_only: Annotated[
        bool, typer.Option("--print", help="verl: print the launch command, do not run it")
    ] = False,
) -> None:
    """RL-train a policy on agent episodes (GRPO/GSPO from verl's core_algos)."""
    from rich.console import Console

    console = Console()
    set_ = list(set_ or [])
    if engine == "verl":
        launch = _verl_launch()
        recipe = str(config) if config is not None else None
        if recipe is None:
            raise UniAgentError("--engine verl needs --config RECIPE")
        if print_only:
            command = launch.build_command(recipe, list(set_))
            typer.echo(command if isinstance(command, str) else shlex.join(str(c) for c in command))
            return
        code = launch.launch(recipe, list(set_))
        if code:
            raise typer.Exit(code)
        return
    if engine != "local":
        raise UniAgentError(f"--engine {engine!r}: use local or verl")
    if print_only:
        raise UniAgentError("--print is for --engine verl (the local trainer has no external command)")
    from uniagent.train.config import build_train_config
    from uniagent.train.local import CURVE, METRICS, run_local

    cfg = build_train_config(config, list(set_))
    out = cfg.trainer.output
    console.print(
        f"[bold]uniagent train --engine local[/]: {cfg.trainer.steps} steps x "
        f"{cfg.trainer.tasks_per_step} tasks x {cfg.trainer.group_size} samples, "
        f"{cfg.algo.adv_estimator}/{cfg.algo.loss_mode}, {cfg.trainer.mode}"
        + (f" (max_staleness {cfg.trainer.max_staleness})" if cfg.trainer.mode == "async" else "")
        + f" -> {out}"
    )

    def show(row: dict) -> None:
        reward = row["reward_mean"]
        console.print(
            f"step {row['step']:>4}  reward {'-' if reward is None else f'{reward:.3f}'}  "
            f"loss {row.get('loss', float('nan')):+.4f}  clipfrac {row.get('pg_clipfrac', 0.0):.3f}  "
            f"kl {row.get('ppo_kl', 0.0):+.5f}  "
            f"logprob gap {row.get('training/rollout_logprob_diff_mean', 0.0):.1e}"
            f"/{row.get('training/rollout_logprob_diff_max', 0.0):.1e}  "
            f"{row['rollout_tokens_per_s']:.0f} tok/s  {row['step_s']:.1f}s"
            + (
                f"  staleness<={row.get('staleness_max', 0)}  interrupted {row.get('interrupted', 0)}"
                if row.get("mode") == "async"
                else ""
            )
        )

    from uniagent.runner.interrupt import resume_command

    run_local(cfg, resume=resume, on_step=show, resume_command=resume_command())
    console.print(
        f"metrics: {out / METRICS}\nreward curve: {out / CURVE}\ncheckpoints: {out / 'checkpoints'}"
    )


def register(app: typer.Typer) -> None:
    """Add `train` to the `uniagent` app (called by `uniagent.cli`)."""
    app.command("train")(train)
