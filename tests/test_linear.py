"""Linear layers on packed weights (models/linear.py): bf16 bitwise the plain product, fp32 within float
noise of it, laid out again after an in-place write, autograd left alone, chosen per dtype by a probe in a
child, the real engine's tokens unchanged."""

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
    monkeypatch.setattr(linear, "choice", lambda *a, **k: PACKED)
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
    monkeypatch.setattr(linear, "choice", lambda *a, **k: PACKED)
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
def test_autograd_keeps_torchs_own_product(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "choice", lambda *a, **k: PACKED)
    model = _model(torch.bfloat16)
    pack_linears(model)
    x = torch.randn(4, 48).to(torch.bfloat16)
    model(x).float().sum().backward()  # trainable weights with grad on: F.linear, gradients flow
    assert model[0].weight.grad is not None


def test_fp32_layers_pack_within_float_noise_and_only_where_fp32_was_picked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fp32's plain product is MKL's: packed outputs agree to float noise, not bitwise; autograd keeps
    torch's product (a trainer's forward and backward are its own); the choice is per dtype."""
    assert linear.supported(torch.float32)  # oneDNN lays out fp32 weights on every x86 CPU with AVX2
    picked = {torch.float32: PACKED, torch.bfloat16: LinearChoice(why="off")}
    monkeypatch.setattr(linear, "choice", lambda dtype=torch.bfloat16, refresh=False: picked[dtype])
    assert pack_linears(_model(torch.bfloat16)) == 0  # bf16 not picked: left alone
    plain, packed = _model(torch.float32), _model(torch.float32)
    assert pack_linears(packed) == 2 and packed_bytes(packed) == (48 * 96 + 96 * 32) * 4
    with torch.inference_mode():
        for x in (torch.randn(1, 48), torch.randn(8, 48), torch.randn(3, 300, 48)):
            want, got = plain(x), packed(x)
            assert (got - want).abs().max() <= linear.TOLERANCE[torch.float32] * want.abs().max()
    x = torch.randn(4, 48)
    packed(x).sum().backward()  # grad on: F.linear on the dense weight, so the same gradients
    plain(x).sum().backward()
    assert torch.equal(packed[0].weight.grad, plain[0].weight.grad)


def test_the_fp32_probe_measures_the_gap_and_the_doctor_says_it(probe_cache: Path) -> None:
    found = linear.choice(torch.float32)
    assert not found.why and found.measured["equal"] is True
    assert 0 <= found.measured["max_rel_diff"] <= linear.TOLERANCE[torch.float32]
    assert found.packed == (found.measured["plain_us"] >= linear.MIN_SPEEDUP * found.measured["packed_us"])
    assert list((probe_cache / "cpu").glob(f"linear-fp32-{cpu.cpu_id()}-*.json"))
    rows = {c.name: c for c in doctor.cpu_checks()}
    assert rows["fp32 linear"].detail == found.describe()
    assert "within" in found.describe() or "bitwise" in found.describe()


def test_not_picked_here_packs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "choice", lambda *a, **k: LinearChoice(why="UNIAGENT_CPU_PROBE=0"))
    model = _model(torch.bfloat16)
    assert pack_linears(model) == 0 and type(model[0]) is torch.nn.Linear


def test_a_cpu_that_cannot_lay_out_keeps_plain_products(
    probe_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AVX2-only CPUs: oneDNN refuses the layout; the probe says so without a child, nothing is packed."""
    monkeypatch.setattr(linear, "supported", lambda dtype=torch.bfloat16: False)
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
    stored = list((probe_cache / "cpu").glob(f"linear-bf16-{cpu.cpu_id()}-*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["packed"] == found.packed
    monkeypatch.setattr(linear, "probe", lambda *a: pytest.fail("probed again"))
    linear.choice.cache_clear()
    assert linear.choice() == found  # read back, not probed
    rows = {c.name: c for c in doctor.cpu_checks()}
    assert rows["bf16 linear"].detail == found.describe() and "bitwise equal" in found.describe()


def test_a_crashing_probe_keeps_plain_products(probe_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "supported", lambda dtype=torch.bfloat16: True)
    monkeypatch.setattr(linear, "_PROBE", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    found = linear.choice()
    assert not found.packed and "SIGSEGV" in found.why and found.describe().startswith("plain (")
    assert not list((probe_cache / "cpu").glob("linear-*.json"))  # a failure is not cached


def test_packed_results_that_differ_are_refused() -> None:
    m = {"rows": 8, "plain_us": 9.0, "packed_us": 1.0, "equal": False, "max_rel_diff": 3e-3}
    assert "differ from plain by 0.003" in LinearChoice(measured=m).describe()


@pytest.mark.slow
@needs_layout
async def test_the_real_bf16_engine_gives_the_same_tokens_and_logprobs_packed(
    smol_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bitwise equal products: the engine's greedy tokens and logprobs are exactly those without packing."""
    from uniagent.models.local import LocalEngine

    prompts = [chat_prompt(smol_tokenizer, q) for q in QUESTIONS[:3]]

    async def run(choice: LinearChoice) -> list:
        monkeypatch.setattr(linear, "choice", lambda *a, **k: choice)
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


@pytest.mark.slow
async def test_the_real_fp32_engine_gives_the_same_tokens_packed(smol_tokenizer, monkeypatch) -> None:
    """fp32 products within float noise: the engine's greedy tokens are those without packing, its
    logprobs within 1e-4."""
    from uniagent.models.local import LocalEngine

    prompts = [chat_prompt(smol_tokenizer, q) for q in QUESTIONS[:3]]

    async def run(choice: LinearChoice) -> tuple[int, list]:
        monkeypatch.setattr(linear, "choice", lambda *a, **k: choice)
        engine = LocalEngine(dtype="float32")
        try:
            packed = sum(type(m) is PackedLinear for m in engine._model.modules())
            assert ("laid out for oneDNN" in engine.memory_line) == bool(packed)
            outs = await asyncio.gather(
                *(engine.generate(p, greedy(max_tokens=12), f"r{i}") for i, p in enumerate(prompts))
            )
            return packed, outs
        finally:
            engine.close()

    (none, plain), (layers, packed) = await run(LinearChoice(why="off")), await run(PACKED)
    assert none == 0 and layers == 30 * 7 + 1
    for a, b in zip(plain, packed, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
