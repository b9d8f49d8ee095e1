"""The local trainer vs verl on CPU: the same config, steps and seed trained by both, in one run.

Per mode (`--modes sync,async`), two child processes one after the other, each with the whole machine:

* local: `uniagent train --engine local --config CONFIG --set trainer.mode=MODE ...` (bench/train_async.py's
  command and child handling), output in OUT/local/MODE, console in OUT/local/MODE.log;
* verl: `uniagent train --engine verl --config CONFIG --set trainer.mode=MODE ...` (sync: main_ppo's legacy
  trainer over recipe multiturn_grpo_cpu; async: fully_async_main over multiturn_gspo_fully_async_cpu),
  run in OUT/verl/MODE (its parquet data, checkpoints dir), its metrics through verl's file logger
  (OUT/verl/MODE/metrics.jsonl) and the rollout server's event log (OUT/verl/MODE/rollout_events.jsonl),
  console in OUT/verl/MODE.log.

Both get `trainer.steps`, `trainer.tasks_per_step`, `trainer.group_size`, `trainer.seed`,
`trainer.save_every=0` and `trainer.tensorboard=false` through the same local config; everything else is
each side's product default (fp32 both, each side's own thread policy). verl additionally gets
`trainer.save_freq=-1` (the local trainer's one checkpoint comes after its last step, outside the steps
measured; verl's would land inside its last step) and its file logger. A side whose child exits non-zero
or completes fewer steps than asked stops the bench: figures come only from runs that finished.

Printed, one JSON object per figure, side and mode (train_verl_rows.py says how verl's rows are read):
``wall_per_step_median_s`` (median over the steps after `--warmup`, with ``min``/``max``/``n``: what the
ratio is taken on), the figures of bench/train_async.py's summary (``wall_per_step_s``: the training wall
over all steps, ``train_wall_s``, ``generated_tokens_per_wall_s``: tokens the engine
generated per training wall second, ``trainer_idle_frac_mean``, ``engine_idle_frac_mean``, reward
windows and gain with its noise, ``reward_curve``: the reward per step), ``tokens_per_s_after_warmup``,
``process_wall_s`` (the child from start to exit: model load, Ray start, the final checkpoint); then per
mode the ratios verl / local and whether each side's reward gain beats its noise.

`--goal rise` (the default): exit 1 unless verl's reward over the last window beats its first by more
than the noise (2 standard errors), in every mode run; `--max-ratio R` also fails a mode whose verl wall
per step exceeds R x the local one. `--lock PATH` (or UNIAGENT_BENCH_LOCK) takes an exclusive flock on
PATH around each verl launch (one verl run at a time on a shared machine: each takes 11-15 GiB), per
launch, so that other users' runs go between the bench's, not for the whole bench.

    .venv/bin/python bench/train_verl.py                       # sync and async, 8 steps of 2 x 4
    .venv/bin/python bench/train_verl.py --modes sync --steps 2 --tasks-per-step 2 --group-size 2
    .venv/bin/python bench/train_verl.py --print               # the four commands, nothing run
    .venv/bin/python bench/train_verl.py --dry-run             # summarise OUT again
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import train_async
import train_async_summary
import train_verl_rows as vr
from uniagent.jsonio import write_text_atomic
from uniagent.train.outputs import METRICS, plot_comparison, read_metrics

BENCH = "train_verl"
SIDES = ("local", "verl")
EVENTS = "rollout_events.jsonl"
SUMMARY = "summary.json"
PNG = "local_vs_verl.png"
WALL = "process_wall_s"  # OUT/SIDE/MODE.process_wall_s: the child's wall clock, start to exit
SKIPPED = {"reward_curve", "reward_last_episodes", "window", "wall_per_step", "staleness_hist"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", type=Path, default=train_async.DEFAULT_CONFIG, help="the local train config"
    )
    parser.add_argument("--steps", type=int, default=8, help="trainer.steps for every run")
    parser.add_argument("--tasks-per-step", type=int, default=2, help="trainer.tasks_per_step")
    parser.add_argument("--group-size", type=int, default=4, help="trainer.group_size (samples per task)")
    parser.add_argument("--seed", type=int, default=0, help="trainer.seed")
    parser.add_argument("--modes", default="sync,async", help="sync, async or sync,async")
    parser.add_argument("--sides", default="local,verl", help="local, verl or local,verl")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE for every run")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_train_verl"), help="output directory")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of the per-step figures")
    parser.add_argument("--window", type=int, help="steps in the first/last reward windows (default steps/4)")
    parser.add_argument("--goal", choices=("rise", "none"), default="rise", help="what exits 1 when missed")
    parser.add_argument("--max-ratio", type=float, help="also fail when verl's wall per step > R x local's")
    parser.add_argument("--timeout-s", type=float, default=3600, help="stop a run after this many seconds")
    parser.add_argument(
        "--lock", default=os.environ.get("UNIAGENT_BENCH_LOCK"), help="flock this file per run"
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--print", dest="print_only", action="store_true", help="print the commands, run nothing"
    )
    what.add_argument("--dry-run", action="store_true", help="run nothing: summarise the runs in OUT")
    return parser


def _names(text: str, allowed: Sequence[str], flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or set(names) - set(allowed):
        raise SystemExit(f"{flag} {text!r}: use {' or '.join(allowed)} (comma-separated)")
    return names


# ----------------------------------------------------------------------------------------- commands


def common_sets(args: argparse.Namespace) -> list[str]:
    """The local-config settings every run gets (train_async.train_command adds mode, seed, output)."""
    return [
        f"trainer.tasks_per_step={args.tasks_per_step}",
        f"trainer.group_size={args.group_size}",
        "trainer.tensorboard=false",
        *args.sets,
    ]


def local_args(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments train_async's child handling reads, for OUT/local/MODE."""
    return argparse.Namespace(
        config=args.config,
        steps=args.steps,
        seed=args.seed,
        sets=common_sets(args),
        out=args.out / "local",
        timeout_s=args.timeout_s,
    )


def verl_command(args: argparse.Namespace, mode: str) -> list[str]:
    """`uniagent train --engine verl` with the local side's settings, its file logger and event log."""
    out = args.out / "verl" / mode
    cmd = train_async.train_command(local_args(args), mode, out)
    cmd[cmd.index("--engine") + 1] = "verl"
    for item in (
        "trainer.logger=[console,file]",
        "trainer.save_freq=-1",
        f"+actor_rollout_ref.rollout.custom={{uniagent_local_events:{out / EVENTS}}}",
    ):
        cmd += ["--set", item]
    return cmd


@contextlib.contextmanager
def locked(path: str | None) -> Iterator[None]:
    """An exclusive flock on `path` for the duration (nothing without a path)."""
    if not path:
        yield
        return
    with open(path, "a") as fh:
        print(f"[{BENCH}] waiting for the lock {path}", file=sys.stderr, flush=True)
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_pids(token: str) -> list[int]:
    """Processes whose environment carries `token` (the verl driver's Ray workers outlive it briefly)."""
    found, needle = [], token.encode()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
    return found


def train_verl(args: argparse.Namespace, mode: str) -> float:
    """One verl run in its own session from a clean OUT/verl/MODE; its wall clock in seconds (the
    processes it started gone). Exits the bench when it fails or passes --timeout-s."""
    out = args.out / "verl" / mode
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = verl_command(args, mode)
    log_path = args.out / "verl" / f"{mode}.log"
    token = f"UNIAGENT_BENCH_RUN={os.getpid()}-{mode}-{time.time_ns()}"
    env = {
        **os.environ,
        "VERL_FILE_LOGGER_PATH": str(out / METRICS),
        "UNIAGENT_BENCH_RUN": token.split("=")[1],
    }
    print(f"[{BENCH}] verl {mode}: {' '.join(cmd)} (console: {log_path})", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=out, env=env, start_new_session=True
        )
        try:
            proc.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            train_async.stop_group(proc)
            raise SystemExit(f"verl {mode} passed --timeout-s {args.timeout_s}; see {log_path}") from None
    wall = time.perf_counter() - started
    deadline = (
        time.monotonic() + 60
    )  # Ray's processes end after the driver: wait, so the next run has the machine
    while _run_pids(token) and time.monotonic() < deadline:
        time.sleep(1)
    if proc.returncode:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-20:])
        raise SystemExit(f"verl {mode} training exited {proc.returncode}; the end of {log_path}:\n{tail}")
    return wall


# ----------------------------------------------------------------------------------------- summary


def load_side(args: argparse.Namespace, side: str, mode: str) -> list[dict[str, Any]]:
    """A finished run's rows in the local schema; exits unless it completed every step."""
    out = args.out / side / mode
    metrics = out / METRICS
    if side == "local":
        rows = [r for r in read_metrics(metrics) if "step" in r] if metrics.exists() else []
    else:
        episodes = args.tasks_per_step * args.group_size
        events = read_metrics(out / EVENTS) if (out / EVENTS).exists() else []
        rows = vr.verl_rows(read_metrics(metrics) if metrics.exists() else [], events, mode, episodes)
    if len(rows) < args.steps:
        raise SystemExit(f"{side} {mode}: {len(rows)} of {args.steps} steps in {metrics}: no figures from it")
    return rows[: args.steps]


def summarise_run(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    figures = train_async_summary.summarise_run(rows, args.window, args.warmup)
    figures.update(vr.per_step(rows, args.warmup))
    return figures


def figure_lines(summary: dict[str, Any], context: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The JSON lines: per mode and side every figure (curve included), then the verdicts."""

    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 4)
        if isinstance(value, list):
            return [rounded(v) for v in value]
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        return value

    for mode, sides in summary["modes"].items():
        for side, figures in sides.items():
            tags = {"mode": mode, "side": side, **context}
            wall = rounded(figures["wall_per_step"])
            median = wall.pop("median")
            yield {
                "bench": BENCH,
                "figure": "wall_per_step_median_s",
                "value": median,
                **wall,
                "unit": "s",
                **tags,
            }
            for name, value in figures.items():
                if name in SKIPPED - {"reward_curve"}:
                    continue
                unit = train_async.unit_of(name)
                unit = "tokens/s" if name == "tokens_per_s_after_warmup" else unit
                yield {"bench": BENCH, "figure": name, "value": rounded(value), "unit": unit, **tags}
        for name, verdict in summary["comparison"].get(mode, {}).items():
            unit = "x" if name.startswith("verl_vs_local") else "reward"
            yield {"bench": BENCH, "figure": name, **rounded(verdict), "unit": unit, "mode": mode, **context}


def summarise(args: argparse.Namespace, modes: list[str], sides: list[str]) -> dict[str, Any]:
    """Figures per mode and side, the verdicts; prints the JSON lines, writes summary.json and the PNG."""
    context = {
        "cores": os.cpu_count(),
        "seed": args.seed,
        "steps": args.steps,
        "tasks_per_step": args.tasks_per_step,
        "group_size": args.group_size,
        "config": str(args.config),
    }
    runs = {(m, s): load_side(args, s, m) for m in modes for s in sides}
    summary: dict[str, Any] = {"context": context, "modes": {}, "comparison": {}}
    for (mode, side), rows in runs.items():
        figures = summarise_run(rows, args)
        wall = args.out / side / f"{mode}.{WALL}"
        if wall.exists():
            figures["process_wall_s"] = float(wall.read_text())
        summary["modes"].setdefault(mode, {})[side] = figures
    for mode, by_side in summary["modes"].items():
        if set(SIDES) <= set(by_side):
            summary["comparison"][mode] = vr.compare(by_side["local"], by_side["verl"], args.max_ratio)
    labelled = {f"{side} {mode}": rows for (mode, side), rows in runs.items()}
    png = plot_comparison(labelled, args.out / PNG, f"local trainer vs verl on CPU: {args.config.name}")
    summary["png"] = str(png) if png else None
    for line in figure_lines(summary, context):
        print(json.dumps(line), flush=True)
    write_text_atomic(args.out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    return summary


def missed(summary: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The goals the run missed, one line each."""
    out = []
    for mode, by_side in summary["modes"].items():
        verdicts = summary["comparison"].get(mode, {})
        if args.goal == "rise" and "verl" in by_side:
            verl = by_side["verl"]
            if not (
                verl["reward_gain"] is not None and verl["reward_gain"] > (verl["reward_gain_noise"] or 0)
            ):
                out.append(
                    f"verl {mode}: reward gain {verl['reward_gain']} within noise {verl['reward_gain_noise']}"
                )
        ratio = verdicts.get("verl_vs_local_wall_per_step", {})
        if args.max_ratio and not ratio.get("met"):
            out.append(f"{mode}: verl / local wall per step {ratio.get('value')} > {args.max_ratio}")
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    args = build_parser().parse_args(argv)
    args.out, args.config = args.out.resolve(), args.config.resolve()  # the children run elsewhere
    modes, sides = _names(args.modes, train_async.MODES, "--modes"), _names(args.sides, SIDES, "--sides")
    if args.print_only:
        for mode in modes:
            if "local" in sides:
                print(
                    shlex.join(train_async.train_command(local_args(args), mode, args.out / "local" / mode))
                )
            if "verl" in sides:
                print(shlex.join(verl_command(args, mode)))
        return None
    if not args.dry_run:
        if not args.config.exists():
            raise SystemExit(f"--config {args.config} does not exist")
        for mode in modes:
            for side in sides:
                (args.out / side / f"{mode}.{WALL}").unlink(missing_ok=True)
                if side == "local":
                    local = local_args(args)
                    wall = train_async.train_run(local, mode, local.out / mode)
                else:
                    with locked(args.lock):
                        wall = train_verl(args, mode)
                # kept beside the run, so that a --dry-run over runs made by several invocations has it
                write_text_atomic(args.out / side / f"{mode}.{WALL}", f"{wall}\n")
    summary = summarise(args, modes, sides)
    failures = missed(summary, args)
    for line in failures:
        print(f"[{BENCH}] goal missed: {line}", file=sys.stderr)
    if failures:
        raise SystemExit(1)
    return summary


if __name__ == "__main__":
    main()
