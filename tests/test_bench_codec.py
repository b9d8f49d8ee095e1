"""bench/codec.py at a tiny size (3 turns, 2 repeats): the real script's functions on the real
tokenizer and verl's builder, cold and warm figures for every method, the ratios per warmth, the
goals gated on the cold figures and the exit code (seconds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # the bench's modules import each other as scripts do

import codec as codec_bench  # noqa: E402

METHODS = {"codec", "full_rerender", "verl", "verl_merge"}


def test_tiny_run_times_every_method_cold_and_warm_and_gates_the_cold_ratios(capsys):
    argv = ["--turns", "3", "--checkpoints", "1,3,50", "--repeats", "2", "--repeats-full", "2"]
    rc = codec_bench.main(argv)
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert all(r["bench"] == "codec_append" for r in rows)
    appends = [r for r in rows if r["figure"] == "append_us"]
    # every method, both warmths, at each checkpoint within --turns (50 is dropped), with the spread
    assert {(r["method"], r["warmth"], r["k"]) for r in appends} == {
        (m, w, k) for m in METHODS for w in ("cold", "warm") for k in (1, 3)
    }
    for r in appends:
        assert len(r["runs"]) == 2 and r["min"] <= r["value"] <= r["max"] and r["value"] > 0

    ratios = {(r["figure"], r["warmth"]): r for r in rows if r["figure"].endswith("_vs_codec")}
    assert set(ratios) == {(f"{m}_vs_codec", w) for m in METHODS - {"codec"} for w in ("cold", "warm")}
    gated = {name for (name, warmth), r in ratios.items() if "goal" in r and warmth == "cold"}
    assert gated == set(codec_bench.GOALS)
    assert not any("goal" in r for (_, warmth), r in ratios.items() if warmth == "warm")
    for name in codec_bench.GOALS:
        r = ratios[(name, "cold")]
        assert r["meets_goal"] is (r["value"] >= r["goal"]) and r["k"] == 3
    assert {r["method"] for r in rows if r["figure"] == "cold_vs_warm"} == METHODS

    last = {r["figure"]: r for r in rows}
    assert last["codec_exact"]["value"] is True
    missed = last["goals_met"]["missed"]
    assert last["goals_met"]["value"] is (not missed) and rc == (1 if missed else 0)


def test_cold_inputs_are_fresh_every_call_and_warm_ones_repeat():
    history = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "ls"},
        {"role": "tool", "content": "a.py\n"},
        {"role": "assistant", "content": "cat a.py"},
        {"role": "tool", "content": "print(1)\n"},
    ]
    cold = codec_bench.inputs_for("cold", history, 3)
    assert len(cold) == 4  # the warm-up call and 3 repeats
    tools = [[m["content"] for m in updated if m["role"] == "tool"] for _, updated in cold]
    assert len({t for call in tools for t in call}) == 8  # every tool result differs in every call
    for (previous, updated), call in zip(cold, tools, strict=True):
        assert previous == updated[:-1] and call[0].startswith("a.py\n") and call[1].startswith("print(1)\n")
    warm = codec_bench.inputs_for("warm", history, 3)
    assert all(x == (history[:-1], history) for x in warm) and len(warm) == 4


def test_no_checkpoint_within_the_turns_says_so():
    with pytest.raises(SystemExit, match="checkpoint within --turns"):
        codec_bench.main(["--turns", "3", "--checkpoints", "50"])
