"""Linear layers on CPU with their weights laid out once for oneDNN, per dtype, where a probe shows it pays.

Why, bf16: torch's bf16 `F.linear` on CPU hands oneDNN a plain [out, in] weight, which oneDNN re-lays into
its blocked layout on every call. At a decode step's few rows that re-layout is a large part of the
work. On an AMD EPYC with AVX512-BF16 (2 threads), one SmolLM2 decode step of 8 rows ran its 211
weight products in 30.3 ms this way. With each weight laid out once it took 18.0 ms, and the engine's
whole decode step at 64 keys went from 70 to 43 ms. Large prefill chunks gain little; nothing was slower.

Why, fp32: torch's fp32 `F.linear` goes to MKL's sgemm, which at a decode step's few rows streams the
weights far below the memory bandwidth. On an AVX2-only AMD EPYC (2 threads) SmolLM2's lm head took 19 ms
at 4 rows (6 GB/s) and 4.8 ms laid out for oneDNN; its MLP products about half the time; prefill-sized
products were no slower. The whole decode step spent 90 ms in weight products plain, 46 ms laid out.

Laying out once is `torch.ops.mkldnn._reorder_linear_weight`; the product is `_linear_pointwise`.
These are the ops torch's inductor emits when it freezes a CPU model. In bf16 they run the kernel torch's
own product runs, on the same layout, so the outputs are bitwise the plain ones. In fp32 the plain product
is MKL's, which adds in another order: the outputs agree to float noise (the probe measures the largest
difference relative to the output and refuses above `TOLERANCE`: 1e-5 for fp32, 0 for bf16).

The cost is a second copy of every packed weight. The dense one stays: weight updates write it, a tied
embedding reads it, `state_dict` returns it, autograd uses it. A weight written in place
(`update_weights`, a trainer's optimizer step on a shared model) bumps its version counter, and the layer
lays it out again on its next call. Only layers on CPU that do not need gradients take the packed
product: autograd keeps `F.linear`, so a trainer's forward and backward are torch's own.

Why a native product, fp32, at a decode step's rows: oneDNN's laid-out product still streamed the
weights at 11-19 GB/s of a 29-31 GB/s read on that AVX2 EPYC; `linear_native.c` (built with the native
attention kernels, `attention_native.py`) asks for the weights ahead of its sums and ran SmolLM2's 211
products 1.3-1.45x faster at 4-8 rows. It reads the dense weight (no copy of its own) and takes up to
`NATIVE_ROWS` rows; prefill-sized products stay on the laid-out weight.

Machines differ (AMX, AVX2-only, other torch builds), so nothing is assumed. `choice(dtype)` times the
ways in a child interpreter, once per CPU, torch, dtype and native source, like the attention probe.
`uniagent doctor` says what was picked for each dtype.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any

import torch

import uniagent.models.attention_native as attention_native
from uniagent.cpu import timed_us

MIN_SPEEDUP = 1.1  # packed must beat plain by this much at the probe's decode shape to be used
# the largest |packed - plain| over the largest |plain| the probe accepts, per dtype (module docstring)
TOLERANCE = {torch.bfloat16: 0.0, torch.float32: 1e-5}
DTYPES = tuple(TOLERANCE)
# The probe: SmolLM2's MLP up-projection and its lm head at a decode step's 8 rows; a 300-row chunk and a
# single row are checked for equality too (oneDNN picks other kernels there).
_SHAPES = ((1536, 576), (49152, 576))
_ROWS = 8
_CHECK_ROWS = (1, 8, 300)
NATIVE_ROWS = 16  # the most rows the native fp32 product takes: a decode step's, not a prefill chunk's
_NATIVE_CHECK_ROWS = (1, 3, 8, NATIVE_ROWS)
# timed: a decode step of 4 rows over 4 of SmolLM2's layers (q, k, v, o, gate, up, down: 57 MB)
_NATIVE_ROWS = 4
_NATIVE_LAYER = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))
_NATIVE_LAYERS = 4
_PROBE = (
    "import json, torch\nfrom uniagent.models.linear import measure\n"
    "print('PROBE', json.dumps(measure(torch.{dtype})))\n"
)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ROWS)


def _packed(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def native_fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `linear_native.c` takes these operands: fp32 on CPU, a contiguous weight whose rows are a
    multiple of 8 long and as long as the input's, and at most `NATIVE_ROWS` input rows (a mismatch is
    left to `F.linear`, which says so)."""
    return (
        x.dtype == weight.dtype == torch.float32
        and x.device.type == weight.device.type == "cpu"
        and x.shape[-1] == weight.shape[1]
        and weight.is_contiguous()
        and weight.shape[1] % 8 == 0
        and x.numel() <= NATIVE_ROWS * weight.shape[1]
        and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
    )


def _native(lib: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` by `linear_native.c` (operands as `native_fits` says)."""
    n, k = weight.shape
    rows = x.numel() // k
    flat = x.reshape(rows, k).contiguous()
    out = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
    bias_ptr = bias.data_ptr() if bias is not None else None
    lib.ua_linear_f32(flat.data_ptr(), weight.data_ptr(), bias_ptr, out.data_ptr(), rows, n, k,
                      torch.get_num_threads())  # fmt: skip
    return out


class PackedLinear(torch.nn.Linear):
    """An `nn.Linear` (swapped in by class, parameters untouched) whose product without autograd uses a
    weight laid out once, laid out again when the weight's version counter says it was written."""

    _packed_weight: torch.Tensor | None = None
    _packed_key: tuple[int, int] | None = None
    _native_path = ""  # the native library, where the probe picked it for a decode step's rows

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles leave the laid-out weight behind (oneDNN's opaque tensor has no storage to
        copy); the copy lays out its own on its first call."""
        state = self.__dict__.copy()
        state.pop("_packed_weight", None)
        state.pop("_packed_key", None)
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (
            (torch.is_grad_enabled() and weight.requires_grad)
            or x.dtype != weight.dtype
            or weight.is_inference()
        ):
            # autograd, a cast input, or a weight made under inference_mode (no version counter: an
            # in-place write could not be seen) take torch's own product
            return torch.nn.functional.linear(x, weight, self.bias)
        if self._native_path and native_fits(x, weight, self.bias):
            lib = attention_native.load(self._native_path)
            if lib is not None:  # None: a cleared cache; the laid-out product runs
                return _native(lib, x, weight, self.bias)
        return _packed(x, self.lay_out(), self.bias)

    def lay_out(self) -> torch.Tensor:
        """The weight in oneDNN's layout, laid out again if the weight was written since."""
        weight = self.weight
        key = (weight._version, weight.data_ptr())
        if self._packed_key != key:
            self._packed_weight = None  # the old layout goes before the new one is made
            self._packed_weight, self._packed_key = _pack(weight), key
        assert self._packed_weight is not None
        return self._packed_weight


def pack_linears(model: torch.nn.Module) -> int:
    """Switch `model`'s CPU `nn.Linear` layers to `PackedLinear` where the probe picked it for their dtype;
    how many were switched (0: not picked here, or nothing on CPU in a dtype the probe covers)."""
    layers = [
        module
        for module in model.modules()
        if type(module) is torch.nn.Linear
        and module.weight.dtype in DTYPES
        and module.weight.device.type == "cpu"
        and not module.weight.is_inference()
    ]
    dtypes = {module.weight.dtype for module in layers}
    picked = {dtype for dtype in dtypes if choice(dtype).packed}  # probed only where there is something
    layers = [module for module in layers if module.weight.dtype in picked]
    if not layers:
        return 0
    native = {dtype: choice(dtype).native for dtype in picked}
    with torch.no_grad():
        for module in layers:
            module.__class__ = PackedLinear
            module._native_path = native[module.weight.dtype]
            module.lay_out()  # now, so the copy's memory is taken at start, not in the middle of a run
    return len(layers)


def packed_bytes(model: torch.nn.Module) -> int:
    """Bytes of the second, laid-out copy of `model`'s packed weights (counted as their dense size)."""
    return sum(
        module.weight.numel() * module.weight.element_size()
        for module in model.modules()
        if isinstance(module, PackedLinear)
    )


def measure(dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """Time plain and packed products in `dtype` on the probe's shapes, and measure how far apart their
    outputs are (run in the probe's child interpreter)."""
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "rows": _ROWS,
        "plain_us": 0.0,
        "packed_us": 0.0,
    }
    diff = 0.0
    with torch.inference_mode():
        for rows_out, rows_in in _SHAPES:
            weight = torch.randn(rows_out, rows_in, generator=gen).to(dtype)
            bias = torch.randn(rows_out, generator=gen).to(dtype)
            packed = _pack(weight)
            for rows in _CHECK_ROWS:
                x = torch.randn(rows, rows_in, generator=gen).to(dtype)
                plain = torch.nn.functional.linear(x, weight, bias).float()
                gap = (_packed(x, packed, bias).float() - plain).abs().max() / plain.abs().max()
                diff = max(diff, float(gap))
            x = torch.randn(_ROWS, rows_in, generator=gen).to(dtype)
            out["plain_us"] += timed_us(lambda x=x, w=weight: torch.nn.functional.linear(x, w))
            out["packed_us"] += timed_us(lambda x=x, p=packed: _packed(x, p, None))
    out["max_rel_diff"] = diff
    out["equal"] = diff <= TOLERANCE[dtype]
    if dtype == torch.float32:
        out.update(_measure_native(gen))
    return out


def _measure_native(gen: torch.Generator) -> dict[str, Any]:
    """The native fp32 product: built (the widest build this CPU runs), checked against float64 at
    `_NATIVE_CHECK_ROWS` with and without bias, and timed against the laid-out product at a decode step
    of `_NATIVE_ROWS` rows over distinct weights larger than the caches, as a model's are read."""
    if os.environ.get("UNIAGENT_NATIVE_LINEAR", "1") == "0":
        return {"native_why": "UNIAGENT_NATIVE_LINEAR=0"}
    name, flags = attention_native.variants()[0]
    path, why = attention_native.build(name, flags)
    lib = attention_native.load(str(path)) if path is not None else None
    if lib is None:
        return {"native_why": why or "the built library did not load"}
    diff = 0.0
    for rows_out, rows_in in _SHAPES:
        weight = torch.randn(rows_out, rows_in, generator=gen)
        bias = torch.randn(rows_out, generator=gen)
        for rows in _NATIVE_CHECK_ROWS:
            x = torch.randn(rows, rows_in, generator=gen)
            for b in (None, bias):
                wide = None if b is None else b.double()
                want = torch.nn.functional.linear(x.double(), weight.double(), wide)
                gap = (_native(lib, x, weight, b).double() - want).abs().max() / want.abs().max()
                diff = max(diff, float(gap))
    weights = [torch.randn(shape, generator=gen) for shape in _NATIVE_LAYER * _NATIVE_LAYERS]
    packed = [_pack(w) for w in weights]
    xs = {k: torch.randn(_NATIVE_ROWS, k, generator=gen) for k in {w.shape[1] for w in weights}}
    return {
        "native_rows": _NATIVE_ROWS,
        "native_us": timed_us(lambda: [_native(lib, xs[w.shape[1]], w, None) for w in weights]),
        "native_packed_us": timed_us(
            lambda: [_packed(xs[w.shape[1]], p, None) for w, p in zip(weights, packed, strict=True)]
        ),
        "native_rel_diff": diff,
        "native_path": str(path),
        "native_variant": name,
    }


@functools.cache
def supported(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether torch's oneDNN lays out `dtype` weights on this CPU at all (bf16: it refuses without
    AVX-512 BW/VL/DQ or AVX-NE-CONVERT, e.g. on AVX2-only CPUs)."""
    try:
        _pack(torch.zeros(16, 16, dtype=dtype))
    except RuntimeError:
        return False
    return True


def _short(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


@dataclass
class LinearChoice:
    """Whether linear layers of one dtype run with packed weights here, and what the probe measured (or
    why it could not)."""

    packed: bool = False
    measured: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    native: str = ""  # the native library for a decode step's rows (fp32), where it was picked

    def describe(self) -> str:
        m = self.measured
        if self.why:
            return f"plain ({self.why})"
        timed = f"{m['rows']} rows: plain {m['plain_us']:g} us, packed {m['packed_us']:g} us"
        diff = m.get("max_rel_diff", 0.0)
        if not m.get("equal"):
            return f"plain (packed results differ from plain by {diff:.2g}; {timed})"
        agree = "bitwise equal" if not diff else f"within {diff:.2g} of plain"
        native = ""
        if "native_us" in m:
            picked = "native" if self.native else "not native"
            native = (f"; {picked} at up to {NATIVE_ROWS} rows ({m['native_rows']} rows: native "
                      f"{m['native_us']:g} us, packed {m['native_packed_us']:g} us; within "
                      f"{m['native_rel_diff']:.2g} of float64)")  # fmt: skip
        elif "native_why" in m:
            native = f"; no native product: {m['native_why']}"
        return f"{'packed' if self.packed else 'plain'} weights ({timed}; {agree}{native})"


def probe(dtype: torch.dtype = torch.bfloat16) -> LinearChoice:
    """Measure in a child interpreter under the torch kernel setting this CPU runs (`uniagent.cpu`). An
    fp32 child that dies is asked again without the native product (`UNIAGENT_NATIVE_LINEAR=0`)."""
    from uniagent import cpu

    if not torch.backends.mkldnn.is_available():
        return LinearChoice(why="this torch has no oneDNN")
    if not supported(dtype):
        need = " (needs AVX-512 BW/VL/DQ)" if dtype == torch.bfloat16 else ""
        return LinearChoice(why=f"this CPU cannot lay out {_short(dtype)} weights for oneDNN{need}")
    code = _PROBE.format(dtype=str(dtype).removeprefix("torch."))
    found, why = cpu.run_torch_probe(code)
    if found is None and dtype == torch.float32:  # the native product is the only code built here
        found, _ = cpu.run_torch_probe(code, {"UNIAGENT_NATIVE_LINEAR": "0"})
        if found is not None:
            found["native_why"] = f"its probe died ({why})"
    if found is None:
        return LinearChoice(why=f"the linear probe failed: {why}")
    packed = bool(found["equal"] and found["plain_us"] >= MIN_SPEEDUP * found["packed_us"])
    native = ""
    if packed and "native_us" in found:  # taken by the packed layers, so it must beat their product
        close = found["native_rel_diff"] <= TOLERANCE[dtype]
        if close and found["native_packed_us"] >= MIN_SPEEDUP * found["native_us"]:
            native = found["native_path"]
    return LinearChoice(packed=packed, measured=found, native=native)


@functools.cache
def choice(dtype: torch.dtype = torch.bfloat16, refresh: bool = False) -> LinearChoice:
    """The cached choice for `dtype` on this CPU and torch, probed (a second, once) when there is none.
    `UNIAGENT_CPU_PROBE=0` keeps plain products without probing."""
    from uniagent import cpu

    if os.environ.get("UNIAGENT_CPU_PROBE", "1") == "0":
        return LinearChoice(why="UNIAGENT_CPU_PROBE=0")
    return cpu.cached_probe(
        f"linear-{_short(dtype)}-{attention_native.source_hash()}",  # a changed native source: probed again
        LinearChoice,
        functools.partial(probe, dtype),
        refresh,
        keep=lambda found: not found.why,
    )
