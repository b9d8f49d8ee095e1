"""The decode attention kernel is chosen per dtype by timing both here (models/attention.py).

The matmul kernel must equal torch's SDPA (padded rows, boolean and additive masks, fp32 and bf16), a
kernel whose probe crashes or disagrees is never picked, the choice is cached per CPU and torch, and the
engine's decode gives the same tokens and logprobs with either kernel.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from engine_helpers import QUESTIONS, chat_prompt, greedy
from uniagent import cpu, doctor
from uniagent.models import attention
from uniagent.models.attention import DecodeChoice, matmul_attention, pick

CRASH = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"


def _inputs(dtype: torch.dtype, rows: int = 3, keys: int = 40) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(rows, 9, 1, 64, generator=gen).to(dtype)
    k = torch.randn(rows, 3, keys + 8, 64, generator=gen)[:, :, :keys].to(dtype)  # a cache view
    v = torch.randn(rows, 3, keys + 8, 64, generator=gen)[:, :, :keys].to(dtype)
    return q, k, v


def _sdpa(q, k, v, mask):
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, scale=0.125, enable_gqa=True
    )
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_kernel_equals_sdpa_with_padded_rows_and_either_mask(dtype: torch.dtype) -> None:
    q, k, v = _inputs(dtype)
    padded = torch.ones(3, 1, 1, 40, dtype=torch.bool)
    padded[0, ..., :25] = False  # a left-padded row
    padded[2, ..., 10:17] = False  # the gap between a reused prefix and new tokens
    additive = torch.zeros(3, 1, 1, 40).masked_fill(~padded, float("-inf"))
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    for mask in (None, padded, additive):
        got = matmul_attention(q, k, v, mask, 0.125)
        assert got.dtype == dtype and got.shape == q.shape
        assert (got.float() - _sdpa(q, k, v, mask)).abs().max() < tolerance
    # The scratch buffers are reused: a smaller call after a larger one still reads only its own keys.
    q2, k2, v2 = _inputs(dtype, rows=1, keys=7)
    assert (
        matmul_attention(q2, k2, v2, None, 0.125).float() - _sdpa(q2, k2, v2, None)
    ).abs().max() < tolerance


def test_pick_needs_agreement_and_a_clear_speedup() -> None:
    def row(sdpa: float, mm: float, err: float = 0.0) -> dict:
        return {"sdpa": {"us": sdpa, "max_err": 0.0}, "matmul": {"us": mm, "max_err": err}}

    assert pick({"fp32": row(300, 290), "bf16": row(2000, 400)}) == {"fp32": "sdpa", "bf16": "matmul"}
    assert pick({"fp32": row(300, 100, err=1.0), "bf16": row(2000, 400, err=0.5)}) == {
        "fp32": "sdpa",
        "bf16": "sdpa",
    }
    assert pick({}) == {"fp32": "sdpa", "bf16": "sdpa"}  # nothing measured: the stock kernel


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNIAGENT_CACHE", str(tmp_path))
    monkeypatch.delenv("UNIAGENT_CPU_PROBE", raising=False)
    attention.choice.cache_clear()
    yield tmp_path
    attention.choice.cache_clear()


def test_a_crashing_probe_keeps_sdpa_and_says_why(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "_PROBE", CRASH + attention._PROBE)
    found = attention.choice()
    assert found.kernels == {"fp32": "sdpa", "bf16": "sdpa"} and "SIGSEGV" in found.why
    assert found.kernel(torch.bfloat16) == "sdpa" and "SIGSEGV" in found.describe()
    assert not list((cache / "cpu").glob("attention-*.json"))  # a failure is not cached


def test_the_probe_runs_in_a_child_once_per_cpu_and_torch(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = attention.choice()
    assert not found.why and set(found.kernels.values()) <= set(attention.KERNELS)
    for name in ("fp32", "bf16"):
        assert found.measured[name]["sdpa"]["us"] > 0 and found.measured[name]["matmul"]["us"] > 0
    stored = list((cache / "cpu").glob(f"attention-{cpu.cpu_id()}-*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["kernels"] == found.kernels
    monkeypatch.setattr(attention, "probe", lambda: pytest.fail("probed again"))
    attention.choice.cache_clear()
    assert attention.choice().kernels == found.kernels  # read back, not probed
    rows = {c.name: c for c in doctor.cpu_checks()}
    assert rows["decode attention"].detail == found.describe() and "bf16" in found.describe()


def test_probe_off_keeps_sdpa(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIAGENT_CPU_PROBE", "0")
    assert attention.choice().kernels == {"fp32": "sdpa", "bf16": "sdpa"}


@pytest.mark.slow
async def test_engine_decode_is_the_same_with_either_kernel(smol_engine, smol_tokenizer, monkeypatch) -> None:
    """The real engine (fp32, padded batches, prefix reuse) gives the same greedy tokens and logprobs
    whichever kernel runs its decode steps."""
    prompts = [chat_prompt(smol_tokenizer, q) for q in QUESTIONS[:3]]

    async def run(kernel: str) -> list:
        chosen = DecodeChoice(dict.fromkeys(("fp32", "bf16"), kernel))
        monkeypatch.setattr(attention, "choice", lambda refresh=False: chosen)
        return await asyncio.gather(
            *(smol_engine.generate(p, greedy(max_tokens=24), f"{kernel}-{i}") for i, p in enumerate(prompts))
        )

    with_sdpa, with_matmul = await run("sdpa"), await run("matmul")
    for a, b in zip(with_sdpa, with_matmul, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
