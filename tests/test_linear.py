"""Linear layers on packed weights (models/linear.py): bf16 bitwise the plain product, fp32 within float
noise of it, laid out again after an in-place write, autograd left alone, chosen per dtype by a probe in a
child, the real engine's tokens unchanged."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from engine_helpers import QUESTIONS, chat_prompt, greedy
from uniagent import cpu, doctor
from uniagent.models import attention_native, linear
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
    assert list((probe_cache / "cpu").glob(f"linear-fp32-*-{cpu.cpu_id()}-*.json"))
    rows = {c.name: c for c in doctor.cpu_checks()}
    assert rows["fp32 linear"].detail == found.describe()
    assert "within" in found.describe() or "bitwise" in found.describe()
    # the native product for a decode step's rows: built, checked against float64, timed against packed
    m = found.measured
    if attention_native.compiler() is not None or os.environ.get("CI") == "true":
        assert "native_us" in m, m.get("native_why")
        assert 0 <= m["native_rel_diff"] <= linear.TOLERANCE[torch.float32]
        faster = m["native_packed_us"] >= linear.MIN_SPEEDUP * m["native_us"]
        assert bool(found.native) == (found.packed and faster)
        assert ("not native" in found.describe()) != bool(found.native)


def _native_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("UNIAGENT_CACHE", str(tmp_path))
    if attention_native.compiler() is None and os.environ.get("CI") != "true":
        pytest.skip("no C compiler")  # under CI a missing compiler fails below
    path, why = attention_native.build(*attention_native.variants()[0])
    assert path is not None, why
    return str(path)


def test_the_native_fp32_product_takes_a_decode_steps_rows_within_float_noise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to NATIVE_ROWS rows (any leading shape, strided input, with and without bias) the native product
    runs and agrees with float64 to float noise; a prefill's rows take the laid-out product; a cleared
    cache falls back to it instead of failing; autograd keeps torch's product."""
    path = _native_library(tmp_path, monkeypatch)
    picked = dataclasses.replace(PACKED, native=path)
    monkeypatch.setattr(linear, "choice", lambda dtype=torch.bfloat16, refresh=False: picked)
    wide, model = _model(torch.float32).double(), _model(torch.float32)
    assert pack_linears(model) == 2 and model[0]._native_path == path == model[2]._native_path
    calls: list[int] = []
    real = linear._native

    def spy(lib, x, weight, bias):
        calls.append(x.numel() // weight.shape[1])
        return real(lib, x, weight, bias)

    monkeypatch.setattr(linear, "_native", spy)
    with torch.inference_mode():
        for x, native in (
            (torch.randn(1, 48), True),
            (torch.randn(5, 1, 48), True),
            (torch.randn(16, 48), True),
            (torch.randn(4, 9, 48)[:, 2:4], True),  # strided: 8 rows
            (torch.randn(17, 48), False),
            (torch.randn(3, 300, 48), False),
        ):
            calls.clear()
            want, got = wide(x.double()), model(x)
            assert got.dtype == torch.float32 and got.shape == want.shape
            assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
            rows = x.numel() // 48
            assert calls == ([rows, rows] if native else []), calls  # both layers, or neither
    assert not linear.native_fits(torch.randn(2, 12), torch.randn(4, 12), None)  # rows not a multiple of 8
    assert not linear.native_fits(torch.randn(2, 16), torch.randn(16, 4).t(), None)  # a strided weight
    assert not linear.native_fits(torch.randn(2, 16), torch.randn(4, 8), None)  # F.linear says why
    with torch.inference_mode(), pytest.raises(RuntimeError):
        model(torch.randn(2, 40))
    model[0]._native_path = model[2]._native_path = str(tmp_path / "cleared.so")
    calls.clear()
    x = torch.randn(2, 48)
    with torch.inference_mode():
        want = wide(x.double())
        assert (model(x).double() - want).abs().max() <= 1e-5 * want.abs().max()
    assert calls == []  # the laid-out product ran
    model(x).sum().backward()  # grad on: F.linear, no native call
    assert calls == [] and model[0].weight.grad is not None


def test_the_probe_picks_the_native_product_only_where_it_beats_the_packed_one(
    probe_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed = {"rows": 8, "plain_us": 3.0, "packed_us": 1.0, "equal": True, "max_rel_diff": 1e-7}
    native = {"native_rows": 4, "native_packed_us": 1.0, "native_rel_diff": 1e-7, "native_path": "/x.so"}
    for extra, packed, picked in (
        ({**native, "native_us": 0.5}, True, "/x.so"),
        ({**native, "native_us": 0.95}, True, ""),  # under MIN_SPEEDUP
        ({**native, "native_us": 0.5, "native_rel_diff": 1e-3}, True, ""),  # past the tolerance
        ({**native, "native_us": 0.5}, False, ""),  # only the packed layers take it
        ({"native_why": "no C compiler (CC, cc or gcc) to build it"}, True, ""),
    ):
        found = {**timed, **extra, "plain_us": 3.0 if packed else 1.0}
        monkeypatch.setattr(cpu, "run_torch_probe", lambda *a, found=found, **k: (found, ""))
        choice = linear.probe(torch.float32)
        assert (choice.packed, choice.native) == (packed, picked)
        described = choice.describe()
        assert ("no native product" in described) == ("native_why" in extra)


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


def test_a_native_product_that_kills_its_probe_is_dropped_and_packing_still_measured(
    probe_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fp32 probe child dies only when the native product runs: it is asked again without it, and the
    laid-out product is still chosen on its own figures."""
    crash = "import os\nif os.environ.get('UNIAGENT_NATIVE_LINEAR') != '0':\n    os.kill(os.getpid(), 11)\n"
    monkeypatch.setattr(linear, "_PROBE", crash + linear._PROBE)
    found = linear.choice(torch.float32)
    assert not found.why and found.native == "" and found.measured["plain_us"] > 0
    assert "SIGSEGV" in found.measured["native_why"] and "SIGSEGV" in found.describe()
    assert found.packed == (found.measured["plain_us"] >= linear.MIN_SPEEDUP * found.measured["packed_us"])
