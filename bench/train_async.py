"""Sync vs fully async local training: the same experiment, steps and seed, in one run on this machine.

Runs `uniagent train --engine local --config CONFIG --set trainer.mode=sync` and then the same with
`trainer.mode=async` (child processes, one after the other, each with the whole machine; outputs in
OUT/sync and OUT/async, their console in OUT/MODE.log), reads both `metrics.jsonl` and prints one JSON
object per figure and mode on stdout:

* ``wall_per_step_s`` (training wall clock, first step's start to last step's end, over the steps:
  what the goal is measured on; ``wall_per_step_after_warmup_s`` and its ratio leave out the first
  `--warmup` steps), ``step_s_median``, ``train_wall_s``, ``process_wall_s`` (the child
  from start to exit: model load and the final checkpoint included; absent with --from);
* ``rollout_tokens_per_s_median`` (the rows' own rate: a sync row counts its rollout phase, an async
  row its whole step), ``generated_tokens_per_wall_s`` (tokens generated over the training wall
  clock: the same measure in both modes);
* ``trainer_idle_frac_mean``, ``engine_idle_frac_mean`` (share of a step's wall the trainer / engine
  had nothing to do; a sync row without them gets them from its phases: the trainer waits through
  the rollout, the engine at least through the update);
* ``reward_first``/``reward_last`` (means over the first and last `--window` steps), ``reward_gain``,
  ``reward_gain_noise``, ``reward_rises`` (gain > 0), ``episodes_trained``,
  ``reward_gain_per_100_episodes`` (learning per sample);
* ``staleness_hist`` (episodes trained per lag, summed over steps) and ``staleness_max``;

then the comparison: ``sync_vs_async_wall_per_step`` (sync / async; goal >= 1.5 on 2 cores, ``met``),
``async_minus_sync_reward_last`` with its noise (2 standard errors of the difference: a reward in
[0, 1] has variance at most p(1-p), p pooled over both windows' episodes) and ``within_noise``, and
``async_minus_sync_gain_per_100_episodes`` with ``not_worse`` (async does not learn worse per sample).
Writes OUT/sync_vs_async.png (reward per step, per wall-clock minute, per episode trained; the
staleness histograms: `uniagent.train.outputs.plot_comparison`) and OUT/summary.json (every figure).

    .venv/bin/python bench/train_async.py                   # configs/train_multiturn.yaml, both modes
    .venv/bin/python bench/train_async.py --steps 4 --set trainer.tasks_per_step=2
    .venv/bin/python bench/train_async.py --modes sync --steps 2    # one mode only
    .venv/bin/python bench/train_async.py --from runs/a runs/b      # summarise two finished runs
    .venv/bin/python bench/train_async.py --dry-run                 # summarise OUT/sync, OUT/async again

Each mode runs with `trainer.save_every=0` (one checkpoint, after the last step: outside the
measured steps) unless a --set says otherwise; --set items go to both modes, after the bench's own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from uniagent.jsonio import write_text_atomic
from uniagent.train.outputs import METRICS, plot_comparison, read_metrics, staleness_totals, wall_clock

BENCH = "train_async"
GOAL = 1.5  # issue 17: async >= 1.5x sync wall-clock per step on 2 cores
MODES = ("sync", "async")
REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "train_multiturn.yaml"
PNG = "sync_vs_async.png"
SUMMARY = "summary.json"
UNITS = {
    "wall_per_step_s": "s",
    "step_s_median": "s",
    "train_wall_s": "s",
    "wall_per_step_after_warmup_s": "s",
    "process_wall_s": "s",
    "rollout_tokens_per_s_median": "tokens/s",
    "generated_tokens_per_wall_s": "tokens/s",
    "trainer_idle_frac_mean": "fraction",
    "engine_idle_frac_mean": "fraction",
    "episodes_trained": "episodes",
    "steps": "steps",
    "staleness_hist": "episodes per lag",
    "staleness_max": "versions",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the train config both modes run")
    parser.add_argument("--steps", type=int, help="trainer.steps for both modes (default: the config's)")
    parser.add_argument("--seed", type=int, default=0, help="trainer.seed for both modes")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE for both modes")
    parser.add_argument("--modes", default="sync,async", help="which modes to train (comma-separated)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_train_async"), help="output directory")
    parser.add_argument(
        "--window", type=int, help="steps in the first/last reward windows (default: steps/4)"
    )
    parser.add_argument(
        "--warmup", type=int, default=0, help="also give the wall per step without the first N steps"
    )
    parser.add_argument("--timeout-s", type=float, help="stop a mode's training after this many seconds")
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--from", dest="from_dirs", nargs=2, type=Path, metavar=("SYNC_DIR", "ASYNC_DIR"),
        help="summarise two finished trainer outputs (modes read from their rows, else this order)",
    )  # fmt: skip
    src.add_argument("--dry-run", action="store_true", help="train nothing: summarise OUT/sync and OUT/async")
    return parser


# ----------------------------------------------------------------------------------------- training


def train_command(args: argparse.Namespace, mode: str, out: Path) -> list[str]:
    """The `uniagent train` command line of one mode: the bench's settings first, the user's --set last."""
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
    for item in [*sets, *args.sets]:
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


def train_mode(args: argparse.Namespace, mode: str) -> float:
    """Train one mode in a child process from a clean OUT/MODE; its wall clock in seconds."""
    out = args.out / mode
    if out.exists():
        shutil.rmtree(out)  # the trainer refuses an output holding checkpoints; a bench run starts fresh
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = train_command(args, mode, out)
    log_path = args.out / f"{mode}.log"
    print(f"[{BENCH}] {mode}: {' '.join(cmd)} (console: {log_path})", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        # its own session, so that a timeout stops the trainer and everything it started (sandboxes)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        try:
            proc.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise SystemExit(f"{mode} training passed --timeout-s {args.timeout_s}; see {log_path}") from None
    wall = time.perf_counter() - started
    if proc.returncode:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-20:])
        raise SystemExit(f"{mode} training exited {proc.returncode}; the end of {log_path}:\n{tail}")
    return wall


# ----------------------------------------------------------------------------------------- summary


def load_runs(dirs: dict[Path, str]) -> dict[str, list[dict[str, Any]]]:
    """Each trainer output's metrics rows under its mode: the `mode` its rows record, else the one
    given for it (rows from before the async trainer say nothing and are sync)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for path, default in dirs.items():
        metrics = path / METRICS
        if not metrics.exists():
            raise SystemExit(f"{metrics} does not exist: pass a trainer output directory (trainer.output)")
        rows = [r for r in read_metrics(metrics) if "step" in r]
        if not rows:
            raise SystemExit(f"{metrics} holds no step rows")
        mode = rows[-1].get("mode", default)
        if mode in runs:
            raise SystemExit(
                f"two directories hold {mode!r} runs ({path} is one): pass one sync and one async"
            )
        runs[mode] = rows
    return runs


def idle_fracs(row: dict[str, Any]) -> tuple[float | None, float | None]:
    """(trainer idle, engine idle) shares of the step. A sync row that lacks one (from before the
    async trainer, or run without the engine's activity probe) gets it from its phases, which never
    overlap: the trainer waits through `rollout_s`, the engine at least through the rest."""
    trainer, engine = row.get("trainer_idle_frac"), row.get("engine_idle_frac")
    step, rollout = row.get("step_s"), row.get("rollout_s")
    if row.get("mode", "sync") == "sync" and step and rollout is not None:
        busy = min(rollout / step, 1.0)
        trainer = busy if trainer is None else trainer
        engine = 1.0 - busy if engine is None else engine
    return trainer, engine


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _reward_window(rows: list[dict[str, Any]]) -> tuple[float | None, int]:
    """(mean reward, episodes) over `rows`, each step weighted by its trainable episodes."""
    weighted = [
        (r["reward_mean"], max(int(r.get("episodes", 1)) - int(r.get("untrainable", 0)), 1)) for r in rows
    ]
    episodes = sum(n for _, n in weighted)
    return (sum(v * n for v, n in weighted) / episodes if episodes else None), episodes


def diff_noise(p1: float, n1: int, p2: float, n2: int) -> float:
    """Two standard errors of the difference of two window means under "no difference": a reward in
    [0, 1] with mean p has variance at most p(1 - p) (equal for 0/1 rewards), p pooled over both
    windows (a window that scored all 0 or all 1 still has noise)."""
    if not n1 or not n2:
        return math.nan
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    return 2 * math.sqrt(max(pooled * (1 - pooled), 0.0) * (1 / n1 + 1 / n2))


def summarise_mode(rows: list[dict[str, Any]], window: int | None = None, warmup: int = 0) -> dict[str, Any]:
    """Every per-mode figure of one run's metrics rows (`warmup`: steps left out of a second wall
    per step, for a first step slowed by what only happens once)."""
    rewarded = [r for r in rows if r.get("reward_mean") is not None]
    k = window or max(1, len(rewarded) // 4)
    k = min(k, max(1, len(rewarded) // 2))
    wall = wall_clock(rows)
    idle = [idle_fracs(r) for r in rows]
    tps = [r["rollout_tokens_per_s"] for r in rows if r.get("rollout_tokens_per_s") is not None]
    generated = [r["generated_tokens"] for r in rows if r.get("generated_tokens") is not None]
    trained = int(sum(float(r.get("episodes_trained") or 0) for r in rows))
    first, first_n = _reward_window(rewarded[:k])
    last, last_n = _reward_window(rewarded[-k:])
    gain = last - first if first is not None and last is not None else None
    gain_noise = diff_noise(first, first_n, last, last_n) if gain is not None else None
    hist = staleness_totals(rows)
    return {
        "steps": len(rows),
        "wall_per_step_s": wall[-1] / len(rows),
        "train_wall_s": wall[-1],
        "wall_per_step_after_warmup_s": (wall[-1] - wall[warmup - 1]) / (len(rows) - warmup)
        if 0 < warmup < len(rows)
        else None,
        "step_s_median": statistics.median(float(r.get("step_s") or 0.0) for r in rows),
        "rollout_tokens_per_s_median": statistics.median(tps) if tps else None,
        "generated_tokens_per_wall_s": sum(generated) / wall[-1]
        if len(generated) == len(rows) and wall[-1]
        else None,
        "trainer_idle_frac_mean": _mean([t for t, _ in idle if t is not None]),
        "engine_idle_frac_mean": _mean([e for _, e in idle if e is not None]),
        "window": k,
        "reward_first": first,
        "reward_last": last,
        "reward_last_episodes": last_n,
        "reward_gain": gain,
        "reward_gain_noise": gain_noise,
        "reward_rises": gain is not None and gain > 0,
        "episodes_trained": trained,
        "reward_gain_per_100_episodes": 100 * gain / trained if gain is not None and trained else None,
        "reward_gain_per_100_episodes_noise": 100 * gain_noise / trained
        if gain_noise is not None and trained
        else None,
        "staleness_hist": {str(lag): n for lag, n in hist.items()},
        "staleness_max": max(hist) if hist else None,
        "reward_curve": [r["reward_mean"] for r in rewarded],
    }


def compare(sync: dict[str, Any], asyn: dict[str, Any]) -> dict[str, Any]:
    """The issue's verdicts: speed-up per step, same final reward within noise, not worse per sample."""
    out: dict[str, Any] = {}
    ratio = sync["wall_per_step_s"] / asyn["wall_per_step_s"] if asyn["wall_per_step_s"] > 0 else math.inf
    out["sync_vs_async_wall_per_step"] = {"value": ratio, "goal": GOAL, "met": ratio >= GOAL}
    if sync["wall_per_step_after_warmup_s"] and asyn["wall_per_step_after_warmup_s"]:
        ratio = sync["wall_per_step_after_warmup_s"] / asyn["wall_per_step_after_warmup_s"]
        out["sync_vs_async_wall_per_step_after_warmup"] = {"value": ratio, "goal": GOAL, "met": ratio >= GOAL}
    if sync["reward_last"] is not None and asyn["reward_last"] is not None:
        diff = asyn["reward_last"] - sync["reward_last"]
        noise = diff_noise(
            sync["reward_last"],
            sync["reward_last_episodes"],
            asyn["reward_last"],
            asyn["reward_last_episodes"],
        )
        out["async_minus_sync_reward_last"] = {
            "value": diff,
            "noise": noise,
            "within_noise": abs(diff) <= noise,
        }
    per_sample = [m["reward_gain_per_100_episodes"] for m in (sync, asyn)]
    if None not in per_sample:
        diff = per_sample[1] - per_sample[0]
        # two independent gains: their noises (2 standard errors each) add in quadrature
        noise = math.hypot(
            sync["reward_gain_per_100_episodes_noise"], asyn["reward_gain_per_100_episodes_noise"]
        )
        out["async_minus_sync_gain_per_100_episodes"] = {
            "value": diff,
            "noise": noise,
            "not_worse": diff >= -noise,
        }
    out["both_rise"] = {"value": sync["reward_rises"] and asyn["reward_rises"]}
    return out


def figure_lines(summary: dict[str, Any], context: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The JSON lines: every per-mode figure (no curves), then the comparison."""
    for mode, figures in summary["modes"].items():
        for name, value in figures.items():
            if name in ("reward_curve", "reward_last_episodes", "window"):
                continue
            unit = UNITS.get(name, "reward" if name.startswith("reward_") else None)
            if isinstance(value, bool):
                unit = None
            elif isinstance(value, float):
                value = round(value, 4)
            yield {"bench": BENCH, "figure": name, "value": value, "unit": unit, "mode": mode, **context}
    for name, verdict in summary.get("comparison", {}).items():
        unit = "x" if name.startswith("sync_vs") else None if name == "both_rise" else "reward"
        rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in verdict.items()}
        yield {"bench": BENCH, "figure": name, **rounded, "unit": unit, **context}


def summarise(
    runs: dict[str, list[dict[str, Any]]],
    out: Path,
    context: dict[str, Any],
    window: int | None = None,
    process_wall: dict[str, float] | None = None,
    warmup: int = 0,
) -> dict[str, Any]:
    """Figures per mode and the comparison; prints the JSON lines, writes the PNG and summary.json."""
    modes = {m: summarise_mode(rows, window, warmup) for m, rows in runs.items()}
    for mode, wall in (process_wall or {}).items():
        modes[mode]["process_wall_s"] = wall
    summary: dict[str, Any] = {"context": context, "modes": modes}
    if all(m in modes for m in MODES):
        summary["comparison"] = compare(modes["sync"], modes["async"])
    out.mkdir(parents=True, exist_ok=True)
    source = Path(context["config"]).name if "config" in context else " vs ".join(context.get("from", []))
    png = plot_comparison(runs, out / PNG, f"uniagent train --engine local, {' vs '.join(runs)}: {source}")
    summary["png"] = str(png) if png else None
    for line in figure_lines(summary, context):
        print(json.dumps(line), flush=True)
    write_text_atomic(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    args.out, args.config = args.out.resolve(), args.config.resolve()  # the children run in the repo root
    context: dict[str, Any] = {"cores": os.cpu_count(), "seed": args.seed}
    process_wall: dict[str, float] = {}
    if args.from_dirs:
        dirs = dict(zip(args.from_dirs, MODES, strict=True))
        context["from"] = [str(d) for d in args.from_dirs]
    else:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not modes or set(modes) - set(MODES):
            raise SystemExit(f"--modes {args.modes!r}: use sync, async or sync,async")
        context["config"] = str(args.config)
        if args.steps is not None:
            context["steps"] = args.steps
        if not args.dry_run:
            if not args.config.exists():
                raise SystemExit(f"--config {args.config} does not exist")
            for mode in modes:
                process_wall[mode] = train_mode(args, mode)
        dirs = {args.out / m: m for m in modes}
    return summarise(load_runs(dirs), args.out, context, args.window, process_wall, args.warmup)


if __name__ == "__main__":
    main()
