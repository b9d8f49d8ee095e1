"""bench/runner.py's figures on stdout: gated on every episode resolving, summarised over repeats,
set against the peer's, and checked against the goals.

A run (one side, one repeat) counts only when every scripted episode is there and resolved
(`all_resolved`); otherwise each of its figures is printed with ``value: null``, ``valid: false``
and what was measured under ``unchecked``, so no number from a run that did not do the work can be
read as a result. Counts that say what went wrong (episodes, resolved, failed, exits, leftovers) are
printed as they are. A summary over repeats, a ratio and a goal are valid only when every run they
rest on is; a goal is met only when valid.
"""

from __future__ import annotations

import statistics
from functools import partial
from typing import Any

from common import emit as common_emit

BENCH = "runner"
US, PEER = "uniagent", "mini-swe-agent"
UNITS = {
    "_s": "s",
    "_ms": "ms",
    "_mb": "MB",
    "_turn": "ms/turn",
    "_util": "fraction",
    "turns_per_s": "turns/s",
}
# What a run did, printed whether or not it counts: the reasons a run is not valid show here.
DIAGNOSTIC = {
    "episodes",
    "resolved",
    "failed",
    "turns",
    "all_resolved",
    "exits",
    "verifier",
    "leftovers",
    "error",
    "open_fds_at_end",
    "threads_at_end",
    "peak_processes",
    "tree_gone_after_s",
}
# Summarised over repeats (median, min, max, every run), for both sides.
SUMMARISED = (
    "episodes_per_min",
    "episodes_per_min_with_startup",
    "wall_s",
    "turns_per_s",
    "cpu_ms_per_turn",
    "cpu_self_ms_per_turn",
    "cpu_children_ms_per_turn",
    "startup_wall_s",
    "startup_cpu_s",
    "process_wall_s",
    "process_cpu_s",
    "cpu_util",
)
# uniagent / peer per repeat: > 1 on episodes_per_min means uniagent is faster; < 1 on the others
# means uniagent takes less wall or CPU.
RATIOS = ("episodes_per_min", "wall_s", "cpu_ms_per_turn", "cpu_self_ms_per_turn")
BASELINE_EP_PER_MIN = {100: 61.6, 1000: 44.1}  # issue 14's table, main at 74b8174, process wall
GOAL_EP_PER_MIN_1000 = 130.0  # issue 14, on the same basis: from the process's start


def unit_of(figure: str) -> str | None:
    if "per_min" in figure:
        return "episodes/min"
    return next((u for end, u in reversed(UNITS.items()) if figure.endswith(end)), None)


emit = partial(common_emit, BENCH)


def emit_run(figs: dict[str, Any], **ctx: Any) -> None:
    """One side's run, one line per figure, gated on `figs["all_resolved"]`."""
    valid = bool(figs.get("all_resolved"))
    for name, value in figs.items():
        if name in DIAGNOSTIC:
            emit(name, value, unit_of(name), **ctx)
        elif valid:
            emit(name, value, unit_of(name), **ctx, valid=True)
        else:
            emit(name, None, unit_of(name), **ctx, valid=False, unchecked=value)


def spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), 3) if values else None,
        "min": min(values, default=None),
        "max": max(values, default=None),
        "runs": values,
    }


def summarise(runs: list[dict[str, Any]], repeats: int, **ctx: Any) -> dict[str, dict[str, Any]]:
    """Median and spread of each SUMMARISED figure over one side's repeats, printed as
    ``stat: median`` lines; valid when all `repeats` runs are."""
    valid = len(runs) == repeats and all(r.get("all_resolved") for r in runs)
    out = {}
    for name in SUMMARISED:
        values = [r[name] for r in runs if isinstance(r.get(name), int | float)]
        s = spread(values)
        out[name] = {**s, "valid": valid}
        median = s.pop("median")
        emit(name, median if valid else None, unit_of(name), **ctx, stat="median", **s, valid=valid)
    return out


def ratios(ours: list[dict[str, Any]], peer: list[dict[str, Any]], **ctx: Any) -> dict[str, dict[str, Any]]:
    """uniagent / peer for each RATIOS figure, per repeat (``repeat: N``) and their median and
    spread (``stat: median``); each valid when both runs it divides are."""
    out = {}
    for name in RATIOS:
        per_repeat, valid = [], len(ours) == len(peer) > 0
        for r, (a, b) in enumerate(zip(ours, peer, strict=False)):
            ok = bool(a.get("all_resolved") and b.get("all_resolved")) and bool(b.get(name))
            value = round(a[name] / b[name], 3) if ok else None
            valid = valid and ok
            per_repeat.append(value)
            emit(f"{US}_vs_peer_{name}", value, "x", **ctx, repeat=r, valid=ok)
        s = spread([v for v in per_repeat if v is not None])
        out[name] = {**s, "valid": valid}
        median = s.pop("median")
        emit(f"{US}_vs_peer_{name}", median if valid else None, "x", **ctx, stat="median", **s, valid=valid)
    return out


def goals(
    level: int,
    ours: dict[str, dict[str, Any]],
    vs_peer: dict[str, dict[str, Any]],
    vs_peer_goal: float | None,
) -> bool:
    """Print each goal that applies at `level` with ``met``; all met (and valid)?"""
    checks = []
    if level >= 1000 and "episodes_per_min_with_startup" in ours:
        s = ours["episodes_per_min_with_startup"]
        met = bool(s["valid"] and s["median"] is not None and s["median"] >= GOAL_EP_PER_MIN_1000)
        checks.append(("episodes_per_min_with_startup", GOAL_EP_PER_MIN_1000, s, met))
    if vs_peer_goal is not None and "episodes_per_min" in vs_peer:
        s = vs_peer["episodes_per_min"]
        met = bool(s["valid"] and s["median"] is not None and s["median"] >= vs_peer_goal)
        checks.append((f"{US}_vs_peer_episodes_per_min", vs_peer_goal, s, met))
    for figure, goal, s, met in checks:
        emit(
            "goal", s["median"], unit_of(figure), level=level, of=figure, goal=goal, met=met, valid=s["valid"]
        )
    return all(met for *_, met in checks)


def vs_baseline(level: int, runs: list[dict[str, Any]], **ctx: Any) -> None:
    """Issue 14's table (process wall, all episodes) against the median on the same basis."""
    base = BASELINE_EP_PER_MIN.get(level)
    if not base:
        return
    valid = bool(runs) and all(r.get("all_resolved") for r in runs)
    med = spread([r["episodes_per_min_with_startup"] for r in runs if "episodes_per_min_with_startup" in r])
    value = round(med["median"] / base, 2) if valid and med["median"] else None
    emit("vs_baseline", value, "x", level=level, **ctx, baseline_episodes_per_min=base, valid=valid)
