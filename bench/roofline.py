"""This machine's ceiling: measured matmul peak per dtype and memory bandwidth, on all its cores.

Why: "faster than last week" says nothing about how far a figure is from what the machine can do.
Every engine and trainer figure is also reported as a fraction of these peaks (model FLOPs utilisation
for prefill and the update, bandwidth utilisation for decode), so "fast" means "near the limit".

Figures (one JSON line each, `bench: roofline`):

* ``matmul_gflops`` per dtype (fp32, bf16, and int8 -> int32 via ``torch._int_mm`` where it runs): the
  best of a few shapes, the first being the issue's 2048x576 @ 576x1536 (a SmolLM2 projection over a
  2K-token prefill), each timed for ``--seconds`` after a warm-up, on ``torch.get_num_threads()``
  threads (all cores unless the environment says otherwise), with the CPU setting `uniagent doctor`
  chose (``uniagent.cpu.apply_torch_choice``: oneDNN held below AMX where AMX crashed); a dtype so slow
  that one call of a larger shape would take over a second (bf16 and int8 emulated on AVX2-only CPUs)
  keeps the first shape's figure. bf16 work is measured against the better of the bf16 and fp32 peaks
  (``ceiling``): widened bf16 operands multiply at the fp32 rate;
* ``memory_gbps``: a copy of a 512 MiB fp32 tensor (read + write bytes over time), the bandwidth a
  decode step that streams the weights can at best use.

The peaks are cached per CPU and torch version (``peaks()``; ``--refresh`` measures again); other
benches import ``peaks``, ``mfu`` and ``bandwidth_util`` from here, and ``transformer_flops`` /
``weight_bytes`` count a model's work the same way for all of them.

    .venv/bin/python bench/roofline.py            # ~10 s; prints and caches the peaks
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import emit
from uniagent import cpu
from uniagent.jsonio import write_json_atomic

BENCH = "roofline"
SHAPES = ((2048, 576, 1536), (4096, 2048, 2048))  # (m, k, n): the shape first
DTYPES = ("fp32", "bf16", "int8")


def _rate(fn: Callable[[], Any], work: float, seconds: float) -> float:
    """Work units per second of `fn`, after two warm-up calls, over at least `seconds`."""
    fn()
    fn()
    began, n = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        fn()
        n += 1
    return work * n / (time.perf_counter() - began)


def matmul_gflops(dtype: str, seconds: float = 0.5, shapes: tuple = SHAPES) -> tuple[float, list[int]]:
    """The best GFLOP/s (GOP/s for int8) over `shapes`, and the shape that gave it."""
    import torch

    best, best_shape = 0.0, list(shapes[0])
    for m, k, n in shapes:
        if best and 2.0 * m * k * n / 1e9 / best > max(seconds, 1.0):
            # a dtype this slow here (emulated: bf16 or int8 without the instructions) would take
            # minutes on the large shape; its peak is what the first shape measured
            continue
        if dtype == "int8":
            a = torch.randint(-64, 64, (m, k), dtype=torch.int8)
            b = torch.randint(-64, 64, (k, n), dtype=torch.int8)

            def fn(a: Any = a, b: Any = b) -> Any:
                return torch._int_mm(a, b)
        else:
            dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
            a, b = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)

            def fn(a: Any = a, b: Any = b) -> Any:
                return a @ b

        rate = _rate(fn, 2.0 * m * k * n / 1e9, seconds)
        if rate > best:
            best, best_shape = rate, [m, k, n]
    return best, best_shape


def memory_gbps(seconds: float = 0.5, mib: int = 512) -> float:
    """Copy bandwidth: bytes read plus bytes written per second, over a tensor far larger than cache."""
    import torch

    src = torch.ones(mib * 1024 * 1024 // 4)
    dst = torch.empty_like(src)
    return _rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4 / 1e9, seconds)


def measure(seconds: float = 0.5) -> dict[str, Any]:
    """Run every figure now (about 10 s at the default)."""
    choice = cpu.apply_torch_choice()
    import torch

    out: dict[str, Any] = {
        "cpu": cpu.model_name(),
        "cpu_id": cpu.cpu_id(),
        "matrix_units": cpu.matrix_units(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_setting": choice.setting if choice else "unprobed",
        "kernels": torch.backends.cpu.get_cpu_capability(),
    }
    for dtype in DTYPES:
        try:
            rate, shape = matmul_gflops(dtype, seconds)
        except (RuntimeError, NotImplementedError) as exc:  # int8 matmul missing on this build/CPU
            out[f"{dtype}_gflops"], out[f"{dtype}_why_not"] = None, str(exc).splitlines()[0][:200]
            continue
        out[f"{dtype}_gflops"], out[f"{dtype}_shape"] = round(rate, 1), shape
    out["memory_gbps"] = round(memory_gbps(seconds), 2)
    cpu.release_openmp_team()  # a bench's engine runs next, in other threads (uniagent.cpu)
    return out


def _cache_path() -> Path:
    return cpu.cache_root() / "bench" / f"roofline-{cpu.cpu_id()}-{cpu.torch_version()}.json"


def peaks(refresh: bool = False) -> dict[str, Any]:
    """The cached peaks for this CPU and torch (measured once, ~10 s, when missing or `refresh`).

    Measured with every core this process may use: a bench then divides its own figure by them."""
    path = _cache_path()
    if not refresh:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
    found = measure()
    with contextlib.suppress(OSError):
        write_json_atomic(path, found)
    return found


def _peak_key(dtype: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16"}.get(dtype, dtype) + "_gflops"


def mfu(flops: float, seconds: float, dtype: str, peak: dict[str, Any] | None = None) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the measured matmul peak of `dtype`."""
    peak = peak or peaks()
    top = ceiling(peak, dtype)
    if not top or seconds <= 0:
        return None
    return round(flops / seconds / 1e9 / top, 4)


def ceiling(peak: dict[str, Any], dtype: str) -> float | None:
    """The matmul ceiling work in `dtype` is measured against. bf16 operands can always be widened and
    multiplied at the fp32 rate (what llama.cpp does on AVX2-only CPUs, where torch's bf16 matmul is
    emulated: 1.2 against 178 GFLOP/s on a 2-core AMD EPYC), so bf16's ceiling is the better of the two."""
    top = peak.get(_peak_key(dtype))
    if _peak_key(dtype) == "bf16_gflops" and peak.get("fp32_gflops"):
        top = max(top or 0.0, peak["fp32_gflops"])
    return top


def bandwidth_util(nbytes: float, seconds: float, peak: dict[str, Any] | None = None) -> float | None:
    """Achieved bytes per second over the measured copy bandwidth."""
    peak = peak or peaks()
    top = peak.get("memory_gbps")
    if not top or seconds <= 0:
        return None
    return round(nbytes / seconds / 1e9 / top, 4)


def transformer_flops(
    config: Any, tokens: int, context: float = 0.0, train: bool = False, head_tokens: int | None = None
) -> float:
    """FLOPs of a decoder's forward over `tokens` tokens attending to `context` positions on average
    (x3 with `train`: forward plus backward). Matmul work only: 2 per weight per token (embedding
    lookups are free, the tied lm head is not, and runs on `head_tokens` positions: default all) plus
    QK^T and AV (4 * layers * heads * head_dim per attended position)."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = getattr(config, "num_key_value_heads", heads) * head_dim
    inter = config.intermediate_size
    per_layer = hidden * (heads * head_dim) * 2 + hidden * kv * 2 + 3 * hidden * inter
    head = tokens if head_tokens is None else head_tokens
    flops = 2.0 * layers * per_layer * tokens + 2.0 * hidden * config.vocab_size * head
    flops += 4.0 * layers * heads * head_dim * context * tokens
    return flops * (3 if train else 1)


def update_flops(config: Any, row: dict[str, Any]) -> float:
    """Forward + backward FLOPs of one training step's update from its metrics row: the positions it
    ran through the layers (`forward_tokens`: a shared prefix once) and projected to the vocabulary
    (`logit_tokens`), attending on average to half an episode's positions. Rows from before those
    fields counted fall back to the trained tokens (a lower bound: context tokens also run)."""
    tokens = float(row.get("forward_tokens") or row.get("train_tokens") or 0)
    if not tokens:
        return 0.0
    episodes = max(int(row.get("episodes") or 1), 1)
    head = int(row.get("logit_tokens") or tokens)
    return transformer_flops(config, int(tokens), tokens / episodes / 2, True, head)


def weight_bytes(model: Any) -> int:
    """Bytes of the parameters a decode step reads (every weight once per step)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--refresh", action="store_true", help="measure again (default: the cache, if any)")
    parser.add_argument("--seconds", type=float, default=0.5, help="timing window per shape")
    args = parser.parse_args()
    found = measure(args.seconds) if args.refresh or args.seconds != 0.5 else peaks()
    if args.refresh:
        with contextlib.suppress(OSError):
            write_json_atomic(_cache_path(), found)
    context = {k: found[k] for k in ("cpu", "threads", "torch", "torch_setting", "kernels", "matrix_units")}
    for dtype in DTYPES:
        value = found.get(f"{dtype}_gflops")
        extra = (
            {"shape": found.get(f"{dtype}_shape")} if value else {"why_not": found.get(f"{dtype}_why_not")}
        )
        unit = "GFLOP/s" if dtype != "int8" else "GOP/s"
        emit(BENCH, "matmul_gflops", value, unit, dtype=dtype, **extra, **context)
    emit(BENCH, "memory_gbps", found["memory_gbps"], "GB/s", **context)
    if found.get("fp32_gflops") and found.get("bf16_gflops"):
        emit(BENCH, "bf16_vs_fp32", round(found["bf16_gflops"] / found["fp32_gflops"], 2), "x", **context)


if __name__ == "__main__":
    main()
