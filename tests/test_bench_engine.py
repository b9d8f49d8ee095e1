"""bench/engine.py at a tiny size (2 episodes x 2 turns, 3 new tokens, two repeats with the engines
interleaved, 16-token prefill prompts): LocalEngine, batched HF generate and, where the binary is built
(always under CI=true), llama-server on the packaged GGUF re-written at bf16. The figures it prints, their
gating and its exit status; the full-size comparison is the bench's job, not a test's."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from conftest import require
from uniagent.models.remote.llama_server import find_binary

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # the bench's modules import each other as scripts do

import engine  # noqa: E402
import engine_gguf  # noqa: E402

TINY = ["--episodes", "2", "--turns", "2", "--first-tokens", "40", "--observation-tokens", "20",
        "--new-tokens", "3", "--repeats", "2", "--prefill-scale", "0.004", "--dtype", "bfloat16"]  # fmt: skip


def test_the_bf16_gguf_holds_the_packaged_tensors_at_full_precision():
    import gguf

    path = engine_gguf.gguf_for("bfloat16")
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    kinds = {t.tensor_type.name for t in tensors.values()}
    assert kinds == {"BF16", "F32"}  # matrices BF16, norms F32: nothing quantized is left
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    assert engine_gguf.gguf_for("bfloat16") == path  # cached


def test_repeats_interleave_the_engines_forwards_then_backwards():
    names = ["local_new", "llama_server", "hf_generate"]
    runs = [engine.engine_order(names, r) for r in range(3)]
    assert runs == [names, names[::-1], names]  # drift over a run shifts every engine alike


@pytest.mark.slow
def test_tiny_agent_run_prints_every_figure_and_gates_the_goals(capsys, caplog):
    caplog.set_level(logging.INFO, logger="engine")
    engines = ["local_new", "hf_generate"]
    if find_binary() is not None:
        engines.append("llama_server")
    else:
        require("llama-server", False, "build it with `make llama-server`")
    code = engine.main([*TINY, "--engines", ",".join(engines)])
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    by = {(r["figure"], r.get("engine")): r for r in rows}
    for name in engines:
        rate = by[("aggregate_tokens_per_s", name)]
        assert rate["complete"] is True and rate["value"] > 0 and rate["short"] == []
        assert rate["precision"] == "bfloat16" and len(rate["spread"]["runs"]) == 2
        assert 0 < by[("prefill_mfu", name)]["value"]["median"] < 1
        assert 0 < by[("decode_bandwidth_util", name)]["value"]["median"] < 1
        for figure in ("prefill_4k", "prefill_4x2k"):
            assert by[(figure, name)]["value"] > 0 and by[(figure, name)]["prompt_tokens"] == 16
    started = [m.split("running ")[1] for m in caplog.messages if ": running " in m]
    assert started == engines + engines[::-1]  # each repeat starts every engine afresh, order alternating
    ttft = [r["turn"] for r in rows if r["figure"] == "ttft_s" and r["engine"] == "local_new"]
    assert ttft == [1, 2]  # LocalEngine streams: its first token is timed
    assert by[("new_vs_hf_generate", None)]["value"] > 0
    goals = [r for r in rows if r["figure"].startswith("goal_")]
    if "llama_server" in engines:
        goals.append(by[("new_vs_llama_server", None)])
    assert {g["figure"] for g in goals} >= {"goal_tokens_per_s", "goal_prefill_of_bf16_peak"}
    assert code == (0 if all(g["met"] for g in goals) else 1)  # a missed goal is a failed run
