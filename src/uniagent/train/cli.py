"""The `uniagent train` command: `--engine local` trains here; another engine (`verl`) is an
integration's, which adds itself to `ENGINES`.

Kept import-light: `uniagent --help` must not pay for torch or verl, so everything heavy is
imported inside the command body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Protocol

import typer

from uniagent.errors import UniAgentError


class TrainEngine(Protocol):
    """An outside trainer `uniagent train --engine NAME` hands off to: the recipe or config
    given, the `--set` overrides, and whether to print its launch command instead of running."""

    def __call__(self, config: str | None, overrides: list[str], print_only: bool) -> None: ...


# `--engine` values other than `local`, filled by the integrations themselves when `uniagent.cli`
# registers their commands (the verl integration adds `verl`): train never imports above itself.
ENGINES: dict[str, TrainEngine] = {}


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
    if engine in ENGINES:
        ENGINES[engine](str(config) if config is not None else None, set_, print_only)
        return
    if engine != "local":
        raise UniAgentError(f"--engine {engine!r}: use one of {', '.join(['local', *sorted(ENGINES)])}")
    if print_only:
        raise UniAgentError("--print is for an outside engine such as verl (local has no external command)")
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
