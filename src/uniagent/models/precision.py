"""`model.dtype`: the precision the local engine and the local trainer compute in, `auto` resolved here.

Why a probe and not a default: on a CPU with AMX (or AVX512-BF16) a bf16 matmul runs several times
faster than fp32 (7-8x on 2 threads of a Sapphire Rapids core pair), on one without them bf16 is
emulated and slower. Machines of one kind differ, so `auto` asks the measurement `uniagent.cpu` already
makes (both matmuls, in a child interpreter, cached per CPU and torch) and picks bf16 only where it ran
at least `BF16_MIN_SPEEDUP` times faster here. On CUDA, `auto` is bf16 where the GPU supports it.

What each value means:

- engine (`LocalEngine`): the dtype of the weights it serves and of its keys/values (prefill, decode,
  the prefix cache); logprobs are always taken from fp32 logits.
- local trainer: the compute dtype. Parameters, gradients and the optimizer state stay fp32 (the
  master weights); `bfloat16` runs the forward/backward under `torch.autocast`, so small updates are
  not lost to bf16's 8-bit mantissa. The engine then serves a bf16 copy, refreshed after each update.
- verl: `actor_rollout_ref.actor.fsdp_config.model_dtype` (integrations/verl/keys.py): verl's CPU path
  is proven in fp32, so `auto` keeps fp32 there and says so.

A bf16 engine sampling for an fp32 recompute is a train/infer mismatch: `algo.rollout_correction`
(truncated importance sampling) is what corrects it; `bench/mismatch.py --dtype bfloat16` measures it.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

DTYPES = ("auto", "float32", "bfloat16", "float16")
BF16_MIN_SPEEDUP = 1.5  # bf16 must beat fp32 by this much in the probe for `auto` to pick it


@dataclass(frozen=True)
class Precision:
    """A resolved `model.dtype`: the torch dtype's name and why it was chosen."""

    dtype: str
    why: str

    @property
    def mixed(self) -> bool:
        """Whether a trainer keeps fp32 masters and computes in a lower precision (autocast)."""
        return self.dtype != "float32"


def check(name: str) -> str:
    """`name` if it is one of DTYPES, else a one-line error naming them."""
    if name not in DTYPES:
        raise ValueError(f"model.dtype {name!r}: one of {', '.join(DTYPES)}")
    return name


def resolve(name: str, device: str = "cpu") -> Precision:
    """The precision `name` means on `device` (an explicit dtype is taken as given)."""
    check(name)
    if name != "auto":
        return Precision(name, "set by model.dtype")
    return _auto(device.split(":", 1)[0])


@functools.cache
def _auto(device: str) -> Precision:
    if device == "cuda":
        import torch

        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return Precision("bfloat16", "auto: this GPU runs bf16")
        return Precision("float32", "auto: no bf16 on this GPU")
    if device != "cpu":
        return Precision("float32", f"auto: no probe for device {device!r}")
    from uniagent import cpu

    try:
        choice = cpu.torch_choice()
    except RuntimeError as exc:
        return Precision("float32", f"auto: the CPU probe failed ({exc})")
    ratio = choice.bf16_gflops / choice.fp32_gflops if choice.fp32_gflops else 0.0
    shown = f"{ratio:.1f}" if ratio >= 0.1 else f"{ratio:.2g}"  # 8.0x; 0.015x where bf16 is emulated
    measured = (
        f"bf16 matmul {shown}x fp32 here ({choice.bf16_gflops:g} vs {choice.fp32_gflops:g} GFLOP/s on "
        "1 thread)"
    )
    if ratio >= BF16_MIN_SPEEDUP:
        return Precision("bfloat16", f"auto: {measured}")
    return Precision("float32", f"auto: {measured}, under {BF16_MIN_SPEEDUP}x")


def autocast(precision: Precision, device: str) -> contextlib.AbstractContextManager:
    """The trainer's compute context: bf16 (or fp16) autocast over fp32 master weights, else nothing."""
    if not precision.mixed:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=device.split(":", 1)[0], dtype=getattr(torch, precision.dtype))


def served_copy(model: Any, precision: Precision) -> Any:
    """The engine's copy of a trainer's fp32 policy in the precision it serves (no gradients)."""
    import copy

    import torch

    return copy.deepcopy(model).to(getattr(torch, precision.dtype)).requires_grad_(False)
