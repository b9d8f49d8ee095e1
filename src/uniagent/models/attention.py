"""Decode attention on CPU: which kernel runs a decode step (one query per row), chosen by running both here.

Why: torch's CPU SDPA (its flash-attention kernel) has a slow path for a single query. On an AMD EPYC
with AVX512-BF16 and no AMX, a bf16 decode step of 4 rows over 1,100 keys took 2.2 ms per layer, 3x
its own time for two queries per row and 5.8x plain matmuls in fp32 (0.40 ms). That was 47 % of the
engine's decode step. In fp32 on the same CPU the two are close. Other CPUs differ (AMX, other torch
builds), so nothing is assumed: `choice()` times both kernels per dtype in a child interpreter, once
per CPU and torch version, like `uniagent.cpu`'s torch probe. A kernel that crashes there, or that
disagrees with an fp32 reference, is never used. `uniagent doctor` shows what was picked and why.

`matmul_attention` keeps the precision class of the SDPA kernel: the scores, softmax and weighted sum are
fp32 whatever the cache holds (a bf16 matmul would round every score to 8 bits of mantissa). Only the
output is cast back to the query's dtype. With `native` its two products run in the C kernels of
`attention_native.py`, which read the cache in place: a bf16 cache widened as it is read instead of
copied to fp32 first, an fp32 one as it lies (on an AVX2-only EPYC, fp32 SDPA and matmuls read a decode
step's cache at a fraction of the memory bandwidth). The probe offers that kernel per dtype where a C
compiler builds it, and times it like the others.

The probe's shape is agent-sized (8 rows over 3,072 keys): the copy the native kernel saves grows with
the context, and at 4 rows x 1,024 keys all three kernels were within 1.2x of each other.

Prefill (many queries per row) is chosen the same way, for bf16: SDPA or the native library's prefill
kernel (`attention_prefill.c`, AVX-512 builds), timed on 2 rows of 256 new tokens over 2,048 keys.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

import uniagent.models.attention_native as attention_native
from uniagent.cpu import timed_us

KERNELS = ("sdpa", "matmul", "native")
MIN_SPEEDUP = 1.2  # a kernel must beat SDPA by this much in the probe to be picked
# The probe's decode shape: SmolLM2's heads (9 query over 3 kv heads of 64), 8 rows over 3,072 keys.
_SHAPE = {"rows": 8, "heads": 9, "kv_heads": 3, "keys": 3072, "head_dim": 64}
# The prefill probe: 2 rows of 256 new tokens after 1,792 kept ones (causal, one row left-padded).
_PREFILL = {"rows": 2, "queries": 256, "keys": 2048}
_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "prefill": 2e-2}  # max |out - fp32 reference| to be trusted
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_ROWS = (*_DTYPES, "prefill")  # what is chosen: decode per dtype, and bf16 prefill
_PROBE = "import json\nfrom uniagent.models.attention import measure\nprint('PROBE', json.dumps(measure()))\n"


def multi_query(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
) -> torch.Tensor | None:
    """A prefill's attention in the native kernel where the probe picked it for this CPU, as
    [rows, queries, heads, dim]; None where SDPA runs (not picked, or operands it does not take)."""
    found = choice()
    if found.kernels.get("prefill") != "native":
        return None
    lib = found.native_library()
    return attention_native.prefill(lib, query, key, value, mask, causal, scale) if lib else None


def matmul_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    native: Any = None,
) -> torch.Tensor:
    """Attention of one query per row, `query` [rows, heads, 1, dim], over grouped `key`/`value`
    [rows, kv_heads, keys, dim], in fp32; `mask` is SDPA's (boolean: True attends; or additive),
    broadcastable to [rows, 1, 1, keys]. Returns [rows, heads, 1, dim] in the query's dtype. `native`:
    the loaded native library, used where it takes the operands (`attention_native.fits`)."""
    rows, heads, _, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    q = query.reshape(rows, kv_heads, group, dim).float() * scale
    scores = _scratch("scores", (rows, kv_heads, group, keys), query.device)
    in_place = native is not None and attention_native.fits(query, key, value)
    if in_place:
        attention_native.scores(native, q.contiguous(), key, scores)
    else:
        torch.matmul(q, _as_fp32(key, "key").transpose(-1, -2), out=scores)
    if mask is not None:
        mask = mask.reshape(mask.shape[0], 1, 1, mask.shape[-1])
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores += mask
    scores -= scores.amax(dim=-1, keepdim=True)  # softmax in place: no fresh [rows, heads, keys] tensor
    scores.exp_()
    scores /= scores.sum(dim=-1, keepdim=True)
    if in_place:
        out = _scratch("out", (rows, kv_heads, group, dim), query.device)
        attention_native.weighted(native, scores, value, out)
    else:
        out = scores @ _as_fp32(value, "value")  # [rows, kv_heads, group, dim]
    return out.reshape(rows, heads, 1, dim).to(query.dtype)


def single_query(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor | None:
    """A decode step's attention with the kernel chosen for this CPU and dtype; None where SDPA is the
    choice (the caller runs its stock call)."""
    found = choice()
    kernel = found.kernel(query.dtype)
    if kernel == "sdpa":
        return None
    native = found.native_library() if kernel == "native" else None
    return matmul_attention(query, key, value, mask, scale, native)


# Reused per thread: a fresh multi-MB fp32 tensor per layer and step is mapped and page-faulted in on
# every allocation (76,000 minor faults in 0.15 s of 4 rows x 1,024 keys: 3-6x the kernel's own time).
_buffers = threading.local()


def _scratch(name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """An fp32 tensor of `shape` in this thread's buffer `name`, grown (never shrunk) as needed."""
    held = _buffers.__dict__.setdefault("held", {})
    need = math.prod(shape)
    buf = held.get(name)
    if buf is None or buf.numel() < need or buf.device != device:
        buf = held[name] = torch.empty(need + need // 4, dtype=torch.float32, device=device)
    return buf[:need].view(shape)


def _as_fp32(t: torch.Tensor, name: str) -> torch.Tensor:
    """`t` itself when fp32, else an fp32 copy in the scratch buffer `name` (valid until its next use)."""
    if t.dtype == torch.float32:
        return t
    return _scratch(name, tuple(t.shape), t.device).copy_(t)


def _sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scale, enable_gqa=True
    )


def measure() -> dict[str, Any]:
    """Time each kernel per dtype on the probe's shape (run in the probe's child interpreter). The native
    kernel is built here unless `UNIAGENT_NATIVE_ATTENTION=0`, its builds raced on bf16 caches, the
    fastest also timed on fp32 ones, and run in this child only."""
    s = _SHAPE
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(s["rows"], s["heads"], 1, s["head_dim"], generator=gen)
    # Keys and values as views into a larger buffer, as the engine's slot cache hands them over.
    buffer = (s["rows"], s["kv_heads"], s["keys"] + 128, s["head_dim"])
    keys, values = torch.randn(buffer, generator=gen), torch.randn(buffer, generator=gen)
    key, value = keys[:, :, : s["keys"]], values[:, :, : s["keys"]]
    mask = torch.ones(s["rows"], 1, 1, s["keys"], dtype=torch.bool)
    mask[0, ..., :100] = False  # a left-padded row
    scale = s["head_dim"] ** -0.5
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "shape": s}
    kernels: dict[str, Any] = {"sdpa": _sdpa, "matmul": matmul_attention}
    with torch.inference_mode():
        reference = _sdpa(query, key, value, mask, scale)
        for name, dtype in _DTYPES.items():
            q = query.to(dtype)
            k, v = keys.to(dtype)[:, :, : s["keys"]], values.to(dtype)[:, :, : s["keys"]]
            row: dict[str, Any] = {}
            for kernel, fn in kernels.items():
                row[kernel] = _trial(fn, (q, k, v, mask, scale), reference)
            if name == "bf16":  # the builds are raced on bf16 caches (the widening is what they differ in)
                out["native"] = native = _native_builds(q, k, v, mask, scale, reference)
                if "path" in native:
                    row["native"] = {"us": native["us"][native["variant"]], "max_err": native["max_err"]}
                    out["prefill"] = _prefill_row(attention_native.load(native["path"]), gen)
                    out["prefill_shape"] = _PREFILL
            out[name] = row
        lib = attention_native.load(out["native"]["path"]) if "path" in out["native"] else None
        if lib is not None:  # the fastest build's fp32 products, on the fp32 operands
            args = (query, keys[:, :, : s["keys"]], values[:, :, : s["keys"]], mask, scale)
            out["fp32"]["native"] = _trial(functools.partial(matmul_attention, native=lib), args, reference)
    return out


def _trial(
    fn: Any, args: tuple, reference: torch.Tensor, tolerance: float | None = None
) -> dict[str, float] | None:
    """One kernel on the probe's operands: its time and its largest error against the fp32 reference.
    None where it is not timed: the kernel returned None (a build without it), or it is off by more
    than `tolerance` (given where only kernels that agree may be raced)."""
    got = fn(*args)
    if got is None:
        return None
    err = float((got.float() - reference).abs().max())
    if tolerance is not None and err > tolerance:
        return None
    return {"us": timed_us(lambda: fn(*args)), "max_err": err}


def _prefill_row(lib: Any, gen: torch.Generator) -> dict[str, Any]:
    """SDPA and the native prefill kernel (where this build has one) timed on the bf16 prefill probe."""
    s, p = _SHAPE, _PREFILL
    q = torch.randn(p["rows"], s["heads"], p["queries"], s["head_dim"], generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(p["rows"], s["kv_heads"], p["keys"], s["head_dim"], generator=gen).to(torch.bfloat16)
            for _ in range(2))  # fmt: skip
    past = p["keys"] - p["queries"]
    mask = torch.ones(p["queries"], p["keys"], dtype=torch.bool).tril(past).repeat(p["rows"], 1, 1, 1)
    mask[0, ..., :100] = False  # a left-padded row
    scale = s["head_dim"] ** -0.5
    reference = _sdpa(q.float(), k.float(), v.float(), mask, scale)
    kernels: dict[str, Any] = {
        "sdpa": lambda: _sdpa(q, k, v, mask, scale).transpose(1, 2),
        "native": lambda: attention_native.prefill(lib, q, k, v, mask, False, scale),
    }
    trials = {kernel: _trial(fn, (), reference.transpose(1, 2)) for kernel, fn in kernels.items()}
    return {kernel: got for kernel, got in trials.items() if got}  # no native: a build without it


def _native_builds(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, reference: Any
) -> dict[str, Any]:
    """Build each native variant this CPU reports and time it on the bf16 probe operands: the fastest one
    that agrees with `reference` (`path`, `variant`, its `max_err`), each one's time (`us`), or why there
    is none (`why`)."""
    if os.environ.get("UNIAGENT_NATIVE_ATTENTION", "1") == "0":
        return {"why": "UNIAGENT_NATIVE_ATTENTION=0"}
    timed: dict[str, Any] = {}
    why = ""
    for name, flags in attention_native.variants():
        path, why = attention_native.build(name, flags)
        lib = attention_native.load(str(path)) if path else None
        if lib is None:
            continue
        fn = functools.partial(matmul_attention, native=lib)
        got = _trial(fn, (q, k, v, mask, scale), reference, _TOLERANCE["bf16"])
        if got:
            timed[name] = (got["us"], str(path), got["max_err"])
    if not timed:
        return {"why": why or "no build agreed with the reference"}
    best = min(timed, key=lambda name: timed[name][0])
    _, path, err = timed[best]
    return {"variant": best, "path": path, "max_err": err, "us": {name: t[0] for name, t in timed.items()}}


@dataclass
class AttentionChoice:
    """The kernel picked for decode per dtype name (`fp32`, `bf16`) and for bf16 prefill (`prefill`), and
    what the probe measured (or why it could not)."""

    kernels: dict[str, str] = field(default_factory=lambda: dict.fromkeys(_ROWS, "sdpa"))
    measured: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    native: str = ""  # the native kernel's library, where it was built and run by the probe

    def native_library(self) -> Any:
        """The native kernel's library, loaded once; None where it is gone (the matmul path runs)."""
        return attention_native.load(self.native) if self.native else None

    def kernel(self, dtype: torch.dtype) -> str:
        name = next((n for n, d in _DTYPES.items() if d == dtype), None)
        return self.kernels.get(name, "sdpa") if name else "sdpa"

    def describe(self) -> str:
        if self.why:
            return f"sdpa ({self.why})"
        parts = []
        for name, kernel in self.kernels.items():
            row = self.measured.get(name, {})
            times = ", ".join(f"{k} {row[k]['us']:g} us" for k in KERNELS if k in row)
            parts.append(f"{name} {kernel} ({times})" if times else f"{name} {kernel}")
        s = self.measured.get("shape", _SHAPE)
        native = self.measured.get("native", {})
        built = (
            f"native {native['variant']} build" if "variant" in native else f"no native: {native.get('why')}"
        )
        p = self.measured.get("prefill_shape", _PREFILL)
        return "; ".join(parts) + (
            f" a layer of {s['rows']} rows x {s['keys']} keys (prefill: {p['rows']} x {p['queries']} new over"
            f" {p['keys']}); {built}"
        )


def pick(measured: dict[str, Any]) -> dict[str, str]:
    """Per dtype: the fastest kernel that agreed with the reference and beat SDPA by MIN_SPEEDUP, else
    sdpa."""
    kernels = {}
    for name in _ROWS:
        row = measured.get(name, {})
        sdpa_us = row.get("sdpa", {}).get("us", 0.0)
        fit = {
            k: r["us"]
            for k, r in row.items()
            if k != "sdpa"
            and r.get("max_err", float("inf")) <= _TOLERANCE[name]
            and sdpa_us >= MIN_SPEEDUP * r["us"]
        }
        kernels[name] = min(fit, key=fit.__getitem__) if fit else "sdpa"
    return kernels


def probe() -> AttentionChoice:
    """Measure in a child interpreter under the torch kernel setting this CPU runs (`uniagent.cpu`). A
    child that dies is asked again without the native kernel (the only code built here)."""
    from uniagent import cpu

    found, why = cpu.run_torch_probe(_PROBE)
    if found is None:
        found, _ = cpu.run_torch_probe(_PROBE, {"UNIAGENT_NATIVE_ATTENTION": "0"})
        if found is None:
            return AttentionChoice(why=f"the attention probe failed: {why}")
        found["native"] = {"why": f"its probe died ({why})"}
    kernels = pick(found)
    native = found.get("native", {}).get("path", "") if "native" in kernels.values() else ""
    return AttentionChoice(kernels, found, native=native)


@functools.cache
def choice(refresh: bool = False) -> AttentionChoice:
    """The cached choice for this CPU and torch, probed (a few seconds, once) when there is none.
    `UNIAGENT_CPU_PROBE=0` keeps SDPA without probing."""
    from uniagent import cpu

    if os.environ.get("UNIAGENT_CPU_PROBE", "1") == "0":
        return AttentionChoice(why="UNIAGENT_CPU_PROBE=0")
    name = f"attention-{attention_native.source_hash()}"  # a changed native kernel is probed again
    return cpu.cached_probe(name, AttentionChoice, probe, refresh, keep=lambda found: not found.why)
