"""The decode attention kernel is chosen per dtype by timing both here (models/attention.py).

The matmul kernel must equal torch's SDPA (padded rows, boolean and additive masks, fp32 and bf16), a
kernel whose probe crashes or disagrees is never picked, the choice is cached per CPU and torch, and the
engine's decode gives the same tokens and logprobs with either kernel.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import torch

from engine_helpers import QUESTIONS, chat_prompt, greedy
from uniagent import cpu, doctor
from uniagent.models import attention, attention_native
from uniagent.models.attention import AttentionChoice, matmul_attention, pick

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

    assert pick({"fp32": row(300, 290), "bf16": row(2000, 400)}) == {
        "fp32": "sdpa",
        "bf16": "matmul",
        "prefill": "sdpa",
    }
    assert pick({"fp32": row(300, 100, err=1.0), "bf16": row(2000, 400, err=0.5)}) == {
        "fp32": "sdpa",
        "bf16": "sdpa",
        "prefill": "sdpa",
    }
    assert pick({}) == {
        "fp32": "sdpa",
        "bf16": "sdpa",
        "prefill": "sdpa",
    }  # nothing measured: the stock kernel
    three = row(2000, 400) | {"native": {"us": 150, "max_err": 0.0}}
    assert pick({"bf16": three}) == {
        "fp32": "sdpa",
        "bf16": "native",
        "prefill": "sdpa",
    }  # the fastest trusted one
    three["native"]["max_err"] = 1.0
    assert pick({"bf16": three}) == {"fp32": "sdpa", "bf16": "matmul", "prefill": "sdpa"}
    prefill = {"sdpa": {"us": 200, "max_err": 0.0}, "native": {"us": 190, "max_err": 0.0}}
    assert pick({"prefill": prefill})["prefill"] == "sdpa"  # 1.05x: not worth a kernel of our own
    prefill["native"]["us"] = 130
    assert pick({"prefill": prefill})["prefill"] == "native"


def test_a_crashing_probe_keeps_sdpa_and_says_why(probe_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "_PROBE", CRASH + attention._PROBE)
    found = attention.choice()
    assert found.kernels == {"fp32": "sdpa", "bf16": "sdpa", "prefill": "sdpa"} and "SIGSEGV" in found.why
    assert found.kernel(torch.bfloat16) == "sdpa" and "SIGSEGV" in found.describe()
    assert not list((probe_cache / "cpu").glob("attention-*.json"))  # a failure is not cached


def test_a_native_kernel_that_kills_its_probe_is_dropped_and_the_rest_still_measured(
    probe_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe child dies only when the native kernel runs: the probe is asked again without it."""
    crash_native = "import os\nif os.environ.get('UNIAGENT_NATIVE_ATTENTION') != '0':\n    " + CRASH.replace(
        "\n", "\n    "
    )
    monkeypatch.setattr(attention, "_PROBE", crash_native + "\n" + attention._PROBE)
    found = attention.choice()
    assert not found.why and found.native == "" and "native" not in found.kernels.values()
    assert "SIGSEGV" in found.measured["native"]["why"] and "SIGSEGV" in found.describe()
    assert found.measured["bf16"]["matmul"]["us"] > 0


def test_the_probe_runs_in_a_child_once_per_cpu_and_torch(
    probe_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = attention.choice()
    assert not found.why and set(found.kernels.values()) <= set(attention.KERNELS)
    for name in ("fp32", "bf16"):
        assert found.measured[name]["sdpa"]["us"] > 0 and found.measured[name]["matmul"]["us"] > 0
        if "path" in found.measured["native"]:  # built here: timed on either cache
            assert found.measured[name]["native"]["us"] > 0
    stored = list((probe_cache / "cpu").glob(f"attention-*-{cpu.cpu_id()}-*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["kernels"] == found.kernels
    monkeypatch.setattr(attention, "probe", lambda: pytest.fail("probed again"))
    attention.choice.cache_clear()
    assert attention.choice().kernels == found.kernels  # read back, not probed
    rows = {c.name: c for c in doctor.cpu_checks()}
    assert rows["attention kernels"].detail == found.describe() and "bf16" in found.describe()


def test_probe_off_keeps_sdpa(probe_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIAGENT_CPU_PROBE", "0")
    assert attention.choice().kernels == {"fp32": "sdpa", "bf16": "sdpa", "prefill": "sdpa"}


@pytest.mark.slow
async def test_engine_decode_is_the_same_with_every_kernel(
    smol_engine, smol_tokenizer, native_lib, monkeypatch
) -> None:
    """The real engine (fp32, padded batches, prefix reuse) gives the same greedy tokens and logprobs
    whichever kernel runs its decode steps: SDPA, the matmuls, or the native kernel reading the fp32
    cache in place."""
    prompts = [chat_prompt(smol_tokenizer, q) for q in QUESTIONS[:3]]
    path = str(next(iter(native_lib.values()))._name)

    async def run(kernel: str) -> list:
        chosen = AttentionChoice(dict.fromkeys(("fp32", "bf16"), kernel), native=path)
        monkeypatch.setattr(attention, "choice", lambda refresh=False: chosen)
        return await asyncio.gather(
            *(smol_engine.generate(p, greedy(max_tokens=24), f"{kernel}-{i}") for i, p in enumerate(prompts))
        )

    with_sdpa = await run("sdpa")
    for kernel in ("matmul", "native"):
        for a, b in zip(with_sdpa, await run(kernel), strict=True):
            assert a.token_ids == b.token_ids, kernel
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4, kernel


@pytest.fixture
def native_lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each build of the native kernel this CPU reports, built into a fresh cache."""
    monkeypatch.setenv("UNIAGENT_CACHE", str(tmp_path))
    if attention_native.compiler() is None and os.environ.get("CI") != "true":
        pytest.skip("no C compiler")  # under CI a missing compiler fails below
    libs = {}
    for name, flags in attention_native.variants():
        path, why = attention_native.build(name, flags)
        assert path is not None, why
        libs[name] = attention_native.load(str(path))
    return libs


def test_native_kernel_equals_sdpa_on_a_strided_bf16_cache_with_either_mask(native_lib) -> None:
    q, k, v = _inputs(torch.bfloat16, rows=3, keys=300)  # more than one block of keys
    k, v = (torch.cat([t, t[:, :, :20]], dim=2)[:, :, :300] for t in (k, v))  # views, as the cache gives
    assert attention_native.fits(q, k, v) and k.stride(2) == 64 and not k.is_contiguous()
    padded = torch.ones(3, 1, 1, 300, dtype=torch.bool)
    padded[0, ..., :250] = False
    padded[2, ..., 10:170] = False
    additive = torch.zeros(3, 1, 1, 300).masked_fill(~padded, float("-inf"))
    for lib in native_lib.values():
        for mask in (None, padded, additive):
            got = matmul_attention(q, k, v, mask, 0.125, native=lib)
            assert got.dtype == torch.bfloat16 and got.shape == q.shape
            assert (got.float() - _sdpa(q, k, v, mask)).abs().max() < 1e-2
    q = q.float()  # an fp32 cache, strided views again: read as it lies, the same sums
    k, v = (torch.cat([t.float(), t[:, :, :20].float()], dim=2)[:, :, :300] for t in (k, v))
    assert attention_native.fits(q, k, v) and not k.is_contiguous()
    assert not attention_native.fits(q, k, v.to(torch.bfloat16))  # mixed caches take the matmul path
    for lib in native_lib.values():
        for mask in (None, padded, additive):
            got = matmul_attention(q, k, v, mask, 0.125, native=lib)
            assert got.dtype == torch.float32 and (got - _sdpa(q, k, v, mask)).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "dim"),
    [(2, 2, 16), (8, 4, 48), (9, 3, 64), (28, 4, 128), (32, 2, 80), (40, 4, 144)],
)
def test_native_products_equal_fp64_for_every_group_and_dim_tile(native_lib, q_heads, kv_heads, dim) -> None:
    """The AVX-512 build tiles groups (1 to 8 at a time, 16/G keys each) and dims (64, then 16 at a time),
    the AVX2 build keys (8 at a time), groups (3) and dims (32, then 8): group sizes 1, 2, 3, 7, 16 and 10,
    dims 16 to 144, and key counts that leave part tiles."""
    gen = torch.Generator().manual_seed(dim)
    group = q_heads // kv_heads
    for keys in (1, 7, 301):
        q = torch.randn(2, kv_heads, group, dim, generator=gen).to(torch.bfloat16).float()
        k, v = (torch.randn(2, kv_heads, keys + 5, dim, generator=gen).to(torch.bfloat16)[:, :, 2 : keys + 2]
                for _ in range(2))  # fmt: skip
        p = torch.softmax(torch.randn(2, kv_heads, group, keys, generator=gen), -1)
        want_s = torch.einsum("rhgd,rhkd->rhgk", q.double(), k.double())
        want_o = torch.einsum("rhgk,rhkd->rhgd", p.double(), v.double())
        for lib in native_lib.values():
            for cache in (torch.bfloat16, torch.float32):  # the values are bf16's, so one reference
                s, o = torch.full_like(p, float("nan")), torch.full_like(q, float("nan"))
                attention_native.scores(lib, q, k.to(cache), s)
                attention_native.weighted(lib, p, v.to(cache), o)
                assert (s.double() - want_s).abs().max() < 1e-4 * dim
                assert (o.double() - want_o).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "dim", "queries", "keys"),
    [
        (9, 3, 64, 37, 300),
        (9, 3, 64, 150, 150),
        (32, 8, 128, 50, 170),
        (16, 1, 64, 20, 90),
        (8, 8, 256, 33, 100),
    ],
)
def test_native_prefill_equals_sdpa_with_prefix_padding_and_causal(
    native_lib, q_heads, kv_heads, dim, queries, keys
) -> None:
    """The prefill kernel (AVX-512 builds; the others say they have none) against fp32 SDPA: a kept
    prefix, a left-padded row, a row whose first queries see only themselves, no mask with causal, and
    a query that sees nothing (zeros, never NaN)."""
    gen = torch.Generator().manual_seed(dim + queries)
    rows = 3
    q = torch.randn(rows, q_heads, queries, dim, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(rows, kv_heads, keys + 7, dim, generator=gen).to(torch.bfloat16)[:, :, 3 : keys + 3]
            for _ in range(2))  # fmt: skip
    mask = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries).repeat(rows, 1, 1, 1)
    mask[0, ..., : min(100, keys - queries)] = False
    mask[1, 0, : queries // 2] = False
    mask[1, 0, torch.arange(1, queries // 2), torch.arange(1, queries // 2)] = True  # row 1, query 0: nothing
    for lib_name, lib in native_lib.items():
        for m, causal in ((mask, False), (None, True)):
            got = attention_native.prefill(lib, q, k, v, m, causal, dim**-0.5)
            if not lib_name.startswith("avx512"):
                assert got is None
                continue
            assert got is not None and got.shape == (rows, queries, q_heads, dim)
            want = torch.nn.functional.scaled_dot_product_attention(
                q.float(),
                k.float(),
                v.float(),
                attn_mask=m,
                is_causal=causal,
                scale=dim**-0.5,
                enable_gqa=True,
            ).transpose(1, 2)
            seen = torch.ones(rows, queries, dtype=torch.bool)
            if m is not None:
                seen[1, 0] = False
                assert (got[1, 0] == 0).all()
            assert (got.float() - want)[seen].abs().max() < 2e-2
    assert (
        attention_native.prefill(lib, q.float(), k.float(), v.float(), None, True, 0.1) is None
    )  # fp32: SDPA


def test_the_native_build_is_cached_and_a_failed_compile_says_why(
    native_lib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, flags = attention_native.variants()[-1]
    path, _ = attention_native.build(name, flags)
    assert (
        path is not None and path.parent == tmp_path / "cpu" and attention_native.source_hash() in path.name
    )
    stamp = path.stat().st_mtime_ns
    assert attention_native.build(name, flags)[0] == path and path.stat().st_mtime_ns == stamp  # reused
    path.unlink()
    path, why = attention_native.build(name, ["-mno-such-flag"])
    assert path is None and "failed" in why
    monkeypatch.setattr(attention_native, "compiler", lambda: None)
    assert attention_native.build(name, flags) == (None, "no C compiler (CC, cc or gcc) to build it")
    gone = AttentionChoice({"fp32": "sdpa", "bf16": "native"}, {}, native=str(tmp_path / "cleared.so"))
    assert gone.native_library() is None  # a cleared cache: decode takes the matmul path, not an error


@pytest.mark.slow
async def test_bf16_engine_decode_with_the_native_kernel_matches_the_matmul_kernel(
    smol_tokenizer, native_lib, monkeypatch
) -> None:
    """A real bf16 engine: the native kernel reads the same cache the matmul kernel copies, so logprobs
    agree to bf16 noise and greedy tokens are the same until a near tie: the attention output is rounded
    to bf16 and 30 layers amplify one rounding step. Measured here, the gap between the native and matmul
    kernels (max 0.13 over the common tokens, first flip at token 8) is that of SDPA against the matmul
    kernel (0.15, first flip at token 8)."""
    from uniagent.models.local import LocalEngine

    prompts = [chat_prompt(smol_tokenizer, q) for q in QUESTIONS[:3]]
    # no kept prefixes: each run computes its prompts itself (a prompt kept by the first run would reach
    # the second as one last token, run by the decode kernel under test instead of the prefill one)
    engine = LocalEngine(dtype="bfloat16", prefix_cache_bytes=0)
    path = str(next(iter(native_lib.values()))._name)
    try:

        async def run(kernel: str, prefill: str = "sdpa") -> list:
            chosen = AttentionChoice({"fp32": kernel, "bf16": kernel, "prefill": prefill}, native=path)
            monkeypatch.setattr(attention, "choice", lambda refresh=False: chosen)
            return await asyncio.gather(
                *(
                    engine.generate(p, greedy(max_tokens=16), f"{kernel}-{prefill}-{i}")
                    for i, p in enumerate(prompts)
                )
            )

        with_matmul, with_native = await run("matmul"), await run("native")
        if next(iter(native_lib)).startswith("avx512"):  # the builds with a prefill kernel
            both_native = await run("native", prefill="native")
            for a, b in zip(with_matmul, both_native, strict=True):
                _assert_bf16_noise(a, b)
    finally:
        engine.close()
    for a, b in zip(with_matmul, with_native, strict=True):
        _assert_bf16_noise(a, b)


def _assert_bf16_noise(a, b) -> None:
    """Greedy tokens equal until a near tie, logprobs within bf16 noise over the common tokens."""
    same = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y), None)
    common = min(len(a.token_ids), len(b.token_ids)) if same is None else same
    assert common >= 5
    assert max(abs(x - y) for x, y in zip(a.logprobs[:common], b.logprobs[:common], strict=False)) < 0.2
    if same is not None:  # a near tie, not a different distribution
        assert a.logprobs[same] < -0.5 and b.logprobs[same] < -0.5


def test_one_query_never_takes_the_prefill_kernel(native_lib, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode with SDPA chosen and no mask (a cache without one): the prefill kernel, chosen for prefill,
    must not run there, where SDPA's `is_causal` is False and a causal kernel would hide all but key 0."""
    from types import SimpleNamespace

    from uniagent.models import kv

    path = str(next(iter(native_lib.values()))._name)
    chosen = AttentionChoice({"fp32": "sdpa", "bf16": "sdpa", "prefill": "native"}, native=path)
    monkeypatch.setattr(attention, "choice", lambda refresh=False: chosen)
    called = []
    monkeypatch.setattr(attention, "multi_query", lambda *a: called.append(a))
    q, k, v = _inputs(torch.bfloat16, rows=2, keys=50)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    out, _ = kv.gqa_sdpa_attention(module, q, k, v, None, scaling=0.125)
    assert not called
    assert (out.transpose(1, 2).float() - _sdpa(q, k, v, None)).abs().max() < 1e-2
