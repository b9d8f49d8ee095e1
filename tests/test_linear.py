"""bf16 linear layers on packed weights (models/linear.py): bitwise the plain product, laid out again after
an in-place write, autograd and fp32 left alone, chosen by a probe in a child, the real engine unchanged."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch

from engine_helpers import QUESTIONS, chat_prompt, greedy
from uniagent import cpu, doctor
from uniagent.models import linear
from uniagent.models.linear import LinearChoice, PackedLinear, pack_linears, packed_bytes

# the tests that force packing need a CPU whose oneDNN lays out bf16 weights; elsewhere the probe's refusal
# is what is tested (test_a_cpu_that_cannot_lay_out_keeps_plain_products)
needs_layout = pytest.mark.skipif(
    not linear.supported(), reason="this CPU cannot lay out bf16 weights for oneDNN (no AVX-512 BW/VL/DQ)"
)
PACKED = LinearChoice(packed=True, measured={"rows": 8, "plain_us": 2.0, "packed_us": 1.0, "equal": True})


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(48, 96), torch.nn.SiLU(), torch.nn.Linear(96, 32, bias=False)
    ).to(dtype)


@needs_layout
def test_packed_layers_give_bitwise_the_plain_product(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "choice", lambda refresh=False: PACKED)
    plain, packed = _model(torch.bfloat16), _model(torch.bfloat16)
    assert pack_linears(packed) == 2 and all(type(m) is PackedLinear for m in (packed[0], packed[2]))
    # laid out at once, so the copy's memory is taken at start; its size is counted
    assert packed[0]._packed_weight is not None and packed[2]._packed_weight is not None
    assert packed_bytes(packed) == (48 * 96 + 96 * 32) * 2 and packed_bytes(plain) == 0
    with torch.inference_mode():
        for x in (
            torch.randn(1, 48),
            torch.randn(8, 48),
            torch.randn(3, 300, 48),
            torch.randn(4, 9, 48)[:, 2:],
        ):
            x = x.to(torch.bfloat16)
            assert torch.equal(plain(x), packed(x))  # 2-D, 3-D and a strided view
    copied = copy.deepcopy(packed)  # the laid-out weights stay behind; the copy lays out its own
    with torch.inference_mode():
        assert torch.equal(copied(x), packed(x)) and copied[0]._packed_weight is not packed[0]._packed_weight
        made_here = copy.deepcopy(packed)  # inference tensors: no version counter, so torch's own product
        assert torch.equal(made_here(x), packed(x)) and made_here[0]._packed_weight is None


@needs_layout
def test_a_weight_written_in_place_is_laid_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight update (`copy_`) or an optimizer step bumps the version counter: the next call repacks."""
    monkeypatch.setattr(linear, "choice", lambda refresh=False: PACKED)
    model = _model(torch.bfloat16).requires_grad_(False)
    pack_linears(model)
    x = torch.randn(8, 48).to(torch.bfloat16)
    with torch.inference_mode():
        before = model(x)
    expected = _model(torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        for target, value in zip(model.parameters(), expected.parameters(), strict=True):
            value.mul_(2)
            target.copy_(value)  # what copy_state does
    with torch.inference_mode():
        after = model(x)
        assert not torch.equal(before, after) and torch.equal(after, expected(x))


@needs_layout
def test_autograd_and_fp32_keep_torchs_own_product(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "choice", lambda refresh=False: PACKED)
    assert pack_linears(_model(torch.float32)) == 0  # fp32: the exactness path is untouched
    model = _model(torch.bfloat16)
    pack_linears(model)
    x = torch.randn(4, 48).to(torch.bfloat16)
    model(x).float().sum().backward()  # trainable weights with grad on: F.linear, gradients flow
    assert model[0].weight.grad is not None


def test_not_picked_here_packs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "choice", lambda refresh=False: LinearChoice(why="UNIAGENT_CPU_PROBE=0"))
    model = _model(torch.bfloat16)
    assert pack_linears(model) == 0 and type(model[0]) is torch.nn.Linear


def test_a_cpu_that_cannot_lay_out_keeps_plain_products(
    probe_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AVX2-only CPUs: oneDNN refuses the layout; the probe says so without a child, nothing is packed."""
    monkeypatch.setattr(linear, "supported", lambda: False)
    monkeypatch.setattr(cpu, "run_torch_probe", lambda *a, **k: pytest.fail("no child needed"))
    found = linear.choice()
    assert not found.packed and "cannot lay out" in found.describe()
    model = _model(torch.bfloat16)
    assert pack_linears(model) == 0 and type(model[0]) is torch.nn.Linear


@needs_layout
def test_the_probe_runs_in_a_child_once_per_cpu_and_torch(
    probe_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = linear.choice()
    assert not found.why and found.measured["equal"] is True
    assert found.measured["plain_us"] > 0 and found.measured["packed_us"] > 0
    assert found.packed == (found.measured["plain_us"] >= linear.MIN_SPEEDUP * found.measured["packed_us"])
    stored = list((probe_cache / "cpu").glob(f"linear-{cpu.cpu_id()}-*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["packed"] == found.packed
    monkeypatch.setattr(linear, "probe", lambda: pytest.fail("probed again"))
    linear.choice.cache_clear()
    assert linear.choice() == found  # read back, not probed
    rows = {c.name: c for c in doctor.cpu_checks()}
    assert rows["bf16 linear"].detail == found.describe() and "bitwise equal" in found.describe()


def test_a_crashing_probe_keeps_plain_products(probe_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "supported", lambda: True)
    monkeypatch.setattr(linear, "_PROBE", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    found = linear.choice()
    assert not found.packed and "SIGSEGV" in found.why and found.describe().startswith("plain (")
    assert not list((probe_cache / "cpu").glob("linear-*.json"))  # a failure is not cached


def test_packed_results_that_differ_are_refused() -> None:
    differ = LinearChoice(measured={"rows": 8, "plain_us": 9.0, "packed_us": 1.0, "equal": False})
    assert "differ" in differ.describe()


@pytest.mark.slow
@needs_layout
async def test_the_real_bf16_engine_gives_the_same_tokens_and_logprobs_packed(
    smol_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bitwise equal products: the engine's greedy tokens and logprobs are exactly those without packing."""
    from uniagent.models.local import LocalEngine

    prompts = [chat_prompt(smol_tokenizer, q) for q in QUESTIONS[:3]]

    async def run(choice: LinearChoice) -> list:
        monkeypatch.setattr(linear, "choice", lambda refresh=False: choice)
        engine = LocalEngine(dtype="bfloat16")
        try:
            packed = sum(type(m) is PackedLinear for m in engine._model.modules())
            assert ("laid out for oneDNN" in engine.memory_line) == bool(packed)  # the copy is said
            outs = await asyncio.gather(
                *(engine.generate(p, greedy(max_tokens=12), f"r{i}") for i, p in enumerate(prompts))
            )
            return packed, outs
        finally:
            engine.close()

    (none, plain), (layers, packed) = await run(LinearChoice(why="off")), await run(PACKED)
    assert none == 0 and layers == 30 * 7 + 1  # every projection and the lm head
    for a, b in zip(plain, packed, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
