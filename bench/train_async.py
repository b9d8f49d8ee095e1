"""Sync vs fully async local training: the same experiment, steps and seed, in alternating pairs.

First the untrained policy's reward: a sync run of the same config, seed and steps whose learning rate
is 1e-30 (no weight moves in fp32 or bf16; its first step samples exactly what a sync run's first step
does, checked), i.e. the initial policy on the same tasks and samples (OUT/untrained). Then `--pairs`
pairs (default 3) of `uniagent train --engine local --config CONFIG` with `trainer.mode=sync`, then
`trainer.mode=async` (child processes, one after the other, each with the whole machine; outputs in
OUT/pairN/MODE, their console in OUT/pairN/MODE.log), so a machine whose speed drifts between runs
moves both sides of a pair alike. It reads every `metrics.jsonl` and prints one JSON line per figure:

* per run (``mode``, ``pair``): ``wall_per_step_s`` (training wall clock over the steps),
  ``wall_per_step_after_warmup_s`` (without the first `--warmup` steps), ``step_s_median``,
  ``train_wall_s``, ``process_wall_s`` (the child from start to exit: model load and the final
  checkpoint included), ``generated_tokens``, ``generated_tokens_per_wall_s`` and
  ``wall_per_generated_token_s`` (the modes generate different token counts: this normalises),
  ``rollout_tokens_per_s_median``, ``trainer_idle_frac_mean``, ``engine_idle_frac_mean``;
  ``update_gflops_per_s`` and ``update_mfu`` (forward + backward FLOPs of every position the update
  ran, `roofline.update_flops`: the rows' `forward_tokens`/`logit_tokens`, a shared prefix once, over
  the update seconds, as a fraction of the measured peak of the trainer's dtype;
  ``update_mfu_of_fp32_peak``/``_of_bf16_peak`` against both), ``rollout_prefill_mfu`` (null
  while the rows do not time the prefill); ``reward_first``/``reward_last`` (means over the first and
  last `--window` steps), ``reward_gain_over_untrained`` with its noise (2 standard errors) and
  ``learned`` (gain > noise), ``reward_gain_per_100_episodes``, ``staleness_hist``;
* ``reward_untrained`` (every episode of the untrained run, with its noise and per-step rewards);
* per pair: ``sync_vs_async_wall_per_step``, ``..._after_warmup``, ``..._wall_per_generated_token``
  (and ``_after_warmup``), ``..._process_wall`` (sync's cost over async's: > 1 is async faster),
  ``async_minus_sync_reward_last`` (``within_noise``), ``async_minus_sync_gain_per_100_episodes``
  (``not_worse``);
* over pairs (``pair: "all"``): the median with ``min``, ``max`` and ``runs`` of each ratio and of the
  main per-mode figures, then ``goals_met``: the per-step ratio's median >= 1.5 (issue 17, on 2 cores;
  with --warmup N the ratio after the warm-up, as a one-time cost in a first step is in the
  whole-process ratio) and each mode's every run learned beyond the untrained reward. The script
  exits 1 when one is missed.

Writes OUT/sync_vs_async.png (reward per step, per wall-clock minute, per episode trained; staleness
histograms; the first pair and the untrained run) and OUT/summary.json (every figure).

    .venv/bin/python bench/train_async.py                   # configs/train_multiturn.yaml, 3 pairs
    .venv/bin/python bench/train_async.py --pairs 2 --steps 3 --set trainer.tasks_per_step=2
    .venv/bin/python bench/train_async.py --modes sync --steps 2 --untrained-steps 0  # one mode only
    .venv/bin/python bench/train_async.py --from runs/a runs/b --untrained runs/u  # finished runs
    .venv/bin/python bench/train_async.py --dry-run                 # summarise OUT again

Each run uses `trainer.save_every=0` (one checkpoint, after the last step: outside the measured steps)
unless a --set says otherwise; --set items go to every run, after the bench's own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from train_async_summary import BENCH, MODES, Costing, Run, summarise_runs
from uniagent.jsonio import write_text_atomic
from uniagent.train.outputs import METRICS, plot_comparison, read_metrics

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "train_multiturn.yaml"
PNG = "sync_vs_async.png"
SUMMARY = "summary.json"
UNTRAINED = "untrained"
PROCESS = "bench_process.json"  # the child's whole wall clock, kept beside its rows for --dry-run
NO_LEARNING = "optim.lr=1e-30"  # Adam moves a weight by ~lr: nothing in fp32 or bf16
UNITS = {
    "step_s_median": "s",
    "rollout_tokens_per_s_median": "tokens/s",
    "generated_tokens_per_wall_s": "tokens/s",
    "generated_tokens": "tokens",
    "update_tokens_counted": "tokens",
    "rollout_prefill_tokens": "tokens",
    "update_gflops_per_s": "GFLOP/s",
    "episodes_trained": "episodes",
    "steps": "steps",
    "staleness_hist": "episodes per lag",
    "staleness_max": "versions",
    "reward_gain_per_100_episodes": "reward per 100 episodes",
    "reward_gain_per_100_episodes_noise": "reward per 100 episodes",
    "async_minus_sync_gain_per_100_episodes": "reward per 100 episodes",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the train config every run runs")
    parser.add_argument("--steps", type=int, help="trainer.steps for every run (default: the config's)")
    parser.add_argument("--seed", type=int, default=0, help="trainer.seed for every run")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE for every run")
    parser.add_argument("--modes", default="sync,async", help="which modes to train (comma-separated)")
    parser.add_argument("--pairs", type=int, default=3, help="alternating sync/async pairs to run")
    parser.add_argument(
        "--untrained-steps", type=int, help="steps of the untrained-policy run (default: --steps; 0: none)"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench_train_async"), help="output directory")
    parser.add_argument(
        "--window", type=int, help="steps in the first/last reward windows (default: steps/4)"
    )
    parser.add_argument(
        "--warmup", type=int, default=0, help="also give the wall per step without the first N steps"
    )
    parser.add_argument("--timeout-s", type=float, help="stop a run's training after this many seconds")
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--from", dest="from_dirs", nargs="+", type=Path, metavar="DIR",
        help="summarise finished trainer outputs (modes from their rows, else sync, async, ...; "
        "the n-th sync pairs with the n-th async)",
    )  # fmt: skip
    src.add_argument("--dry-run", action="store_true", help="train nothing: summarise OUT again")
    parser.add_argument("--untrained", type=Path, help="with --from: the untrained-policy run's output")
    return parser


# ----------------------------------------------------------------------------------------- training


def train_command(args: argparse.Namespace, mode: str, out: Path, extra: Sequence[str] = ()) -> list[str]:
    """The `uniagent train` command line of one run: the bench's settings first, the user's --set last."""
    uniagent = Path(sys.executable).with_name("uniagent")
    exe = (
        [str(uniagent)]
        if uniagent.exists()
        else [sys.executable, "-c", "from uniagent.cli import main; main()"]
    )
    sets = [
        f"trainer.mode={mode}",
        f"trainer.seed={args.seed}",
        f"trainer.output={out}",
        "trainer.save_every=0",
    ]
    if args.steps is not None:
        sets.append(f"trainer.steps={args.steps}")
    cmd = [*exe, "train", "--engine", "local", "--config", str(args.config)]
    for item in [*sets, *extra, *args.sets]:
        cmd += ["--set", item]
    return cmd


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM the child's process group (the trainer cleans up its sandboxes), SIGKILL after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def train_run(args: argparse.Namespace, mode: str, out: Path, extra: Sequence[str] = ()) -> float:
    """Train one run in a child process from a clean `out`; its wall clock in seconds (also kept in
    `out`/bench_process.json)."""
    if out.exists():
        shutil.rmtree(out)  # the trainer refuses an output holding checkpoints; a bench run starts fresh
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = train_command(args, mode, out, extra)
    log_path = out.with_name(f"{out.name}.log")
    name = str(out.relative_to(args.out))
    print(f"[{BENCH}] {name}: {' '.join(cmd)} (console: {log_path})", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        # its own session, so that a timeout stops the trainer and everything it started (sandboxes)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        try:
            proc.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise SystemExit(f"{name} training passed --timeout-s {args.timeout_s}; see {log_path}") from None
    wall = time.perf_counter() - started
    if proc.returncode:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-20:])
        raise SystemExit(f"{mode} training exited {proc.returncode}; the end of {log_path}:\n{tail}")
    write_text_atomic(out / PROCESS, json.dumps({"process_wall_s": wall}) + "\n")
    return wall


def train_all(args: argparse.Namespace, modes: list[str]) -> None:
    """The untrained-policy run first, then the pairs, alternating the modes within each pair."""
    untrained_steps = args.steps if args.untrained_steps is None else args.untrained_steps
    if untrained_steps != 0:
        extra = [NO_LEARNING] + ([f"trainer.steps={untrained_steps}"] if untrained_steps else [])
        train_run(args, "sync", args.out / UNTRAINED, extra)
    for pair in range(1, args.pairs + 1):
        for mode in modes:
            train_run(args, mode, args.out / f"pair{pair}" / mode)


# ----------------------------------------------------------------------------------------- summary


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The step rows of one trainer output, or a one-line error saying what to pass."""
    metrics = path / METRICS
    if not metrics.exists():
        raise SystemExit(f"{metrics} does not exist: pass a trainer output directory (trainer.output)")
    rows = [r for r in read_metrics(metrics) if "step" in r]
    if not rows:
        raise SystemExit(f"{metrics} holds no step rows")
    return rows


def load_run(path: Path, mode: str, pair: int) -> Run:
    """One trainer output as a run: the `mode` its rows record (rows from before the async trainer
    say nothing and are `mode`), with the child's wall clock where the bench kept it."""
    rows = read_rows(path)
    wall = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        wall = float(json.loads((path / PROCESS).read_text())["process_wall_s"])
    return Run(rows[-1].get("mode", mode), pair, rows, wall)


def from_dirs(dirs: Sequence[Path]) -> list[Run]:
    """Finished outputs in any order: the n-th of each mode makes pair n (a mode from the rows,
    else sync, async, sync, ... by position)."""
    runs, seen = [], {m: 0 for m in MODES}
    for i, path in enumerate(dirs):
        run = load_run(path, MODES[i % 2], 0)
        seen[run.mode] += 1
        run.pair = seen[run.mode]
        runs.append(run)
    if len(dirs) > 1 and seen["sync"] != seen["async"]:
        raise SystemExit(
            f"{seen['sync']} sync and {seen['async']} async runs: pass as many sync as async runs to pair"
        )
    return runs


def out_dirs(out: Path, modes: list[str]) -> list[Run]:
    """OUT's runs: OUT/pairN/MODE, else (a run from before the pairs) OUT/MODE as pair 1."""
    found = sorted(
        (int(m.group(1)), d) for d in out.glob("pair*") if (m := re.fullmatch(r"pair(\d+)", d.name))
    )
    if not found:
        return [load_run(out / mode, mode, 1) for mode in modes]
    return [load_run(d / mode, mode, n) for n, d in found for mode in modes if (d / mode).exists()]


def costing(config: Path, sets: Sequence[str], runs: list[Run]) -> Costing | None:
    """The model and dtype the runs trained (a dtype the rows record wins over the config's) with
    this machine's peaks; None, with a note on stderr, where the config or model cannot be read."""
    from roofline import peaks

    try:
        from transformers import AutoConfig

        from uniagent.models.loading import dequantized_dir, resolve_model
        from uniagent.train.config import build_train_config

        cfg = build_train_config(config, list(sets))
        source = resolve_model(cfg.model.spec)
        cached = dequantized_dir(source, "float32")
        if cached is not None and (cached / "config.json").is_file():
            hf = AutoConfig.from_pretrained(str(cached))
        else:
            hf = AutoConfig.from_pretrained(source.path, **source.kwargs())
        dtype = next((r.rows[-1]["dtype"] for r in runs if r.rows[-1].get("dtype")), cfg.model.dtype)
        return Costing(hf, dtype, peaks())
    except Exception as exc:  # the utilisation figures are extra: summarise without them
        print(f"[{BENCH}] no MFU figures: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def figure_lines(summary: dict[str, Any], context: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The JSON lines: the untrained reward; every run's figures (with `pair`); each pair's verdicts;
    then the medians and spread over pairs (`pair: "all"`) and the goals."""

    def line(figure: str, value: Any, unit: str | None, **extra: Any) -> dict[str, Any]:
        return {"bench": BENCH, "figure": figure, "value": _rounded(value), "unit": unit, **extra, **context}

    untrained = summary.get("untrained")
    if untrained:
        extra = {
            k: untrained[k] for k in ("episodes", "per_step", "same_first_step_as_sync") if k in untrained
        }
        yield line(
            "reward_untrained", untrained["reward"], "reward", noise=_rounded(untrained["noise"]), **extra
        )
    for run in summary["runs"]:
        for name, value in run["figures"].items():
            if name in ("reward_curve", "reward_last_episodes", "window", "reward_untrained"):
                continue
            yield line(
                name,
                value,
                None if isinstance(value, bool) else unit_of(name),
                mode=run["mode"],
                pair=run["pair"],
            )
    for pair in summary["pairs"]:
        for name, verdict in pair["comparison"].items():
            rest = {k: _rounded(v) for k, v in verdict.items() if k != "value"}
            yield line(name, verdict["value"], unit_of(name), pair=pair["pair"], **rest)
    for mode, figures in summary["modes"].items():
        for name, stats in figures.items():
            if name == "learned":
                yield line(name, stats["value"], None, mode=mode, pair="all", runs=stats["runs"])
                continue
            rest = {k: _rounded(v) for k, v in stats.items() if k != "median"}
            yield line(name, stats["median"], unit_of(name), mode=mode, pair="all", **rest)
    for name, stats in summary["ratios"].items():
        rest = {k: _rounded(v) for k, v in stats.items() if k != "median"}
        yield line(name, stats["median"], "x", pair="all", **rest)
    yield line("goals_met", summary["goals_met"], None, goals=summary["goals"])


def unit_of(name: str) -> str | None:
    """The unit of a figure, from its name."""
    if name in UNITS:
        return UNITS[name]
    if name.startswith("sync_vs_async"):
        return "x"
    if name.endswith("_s"):
        return "s"
    if "mfu" in name or name.endswith("_frac_mean"):
        return "fraction"
    if name.startswith(("reward_", "async_minus_sync")):
        return "reward"
    return None


def summarise(
    runs: list[Run],
    out: Path,
    context: dict[str, Any],
    untrained: list[dict[str, Any]] | None = None,
    window: int | None = None,
    warmup: int = 0,
    cost: Costing | None = None,
) -> dict[str, Any]:
    """Every figure; prints the JSON lines, writes the PNG (the first pair and the untrained run) and
    summary.json."""
    summary = {"context": context, **summarise_runs(runs, untrained, window, warmup, cost)}
    out.mkdir(parents=True, exist_ok=True)
    first = min((r.pair for r in runs), default=1)
    curves = {r.mode: r.rows for r in runs if r.pair == first}
    if untrained:
        curves[UNTRAINED] = untrained
    source = Path(context["config"]).name if "config" in context else " vs ".join(context.get("from", []))
    png = plot_comparison(
        curves, out / PNG, f"uniagent train --engine local, {' vs '.join(curves)}: {source}"
    )
    summary["png"] = str(png) if png else None
    for line in figure_lines(summary, context):
        print(json.dumps(line), flush=True)
    write_text_atomic(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    args.out, args.config = args.out.resolve(), args.config.resolve()  # the children run in the repo root
    context: dict[str, Any] = {"cores": os.cpu_count(), "seed": args.seed}
    untrained_dir = args.untrained
    if args.from_dirs:
        runs = from_dirs(args.from_dirs)
        context["from"] = [str(d) for d in args.from_dirs]
    else:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not modes or set(modes) - set(MODES):
            raise SystemExit(f"--modes {args.modes!r}: use sync, async or sync,async")
        if args.pairs < 1:
            raise SystemExit(f"--pairs {args.pairs}: run at least one pair")
        context["config"] = str(args.config)
        if args.steps is not None:
            context["steps"] = args.steps
        if not args.dry_run:
            if not args.config.exists():
                raise SystemExit(f"--config {args.config} does not exist")
            context["pairs"] = args.pairs
            train_all(args, modes)
        runs = out_dirs(args.out, modes)
        if (args.out / UNTRAINED / METRICS).exists():
            untrained_dir = args.out / UNTRAINED
    untrained = read_rows(untrained_dir) if untrained_dir else None
    cost = costing(args.config, args.sets, runs)
    return summarise(runs, args.out, context, untrained, args.window, args.warmup, cost)


if __name__ == "__main__":
    raise SystemExit(0 if main()["goals_met"] else 1)
