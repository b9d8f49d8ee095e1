"""The native decode attention kernel (`attention_native.c`): built here, for this CPU, on first use.

torch has no CPU product of bf16 operands with an fp32 result, so `matmul_attention` copies each
layer's bf16 keys and values to fp32 before its matmuls; at agent-sized contexts that copy, not the
arithmetic, was the decode step (73 % of it at 8 rows x 4K keys). The C kernels widen each row as they
read it. fp32 caches get the same two products without the widening (`ua_scores_f32`,
`ua_weighted_f32`): torch's single-query SDPA and batched matmuls read an fp32 cache well below the
memory bandwidth on an AVX2-only CPU, and the probe times them against this one per dtype.
The same library holds a decode step's fp32 weight products (`linear_native.c`), which the linear
probe times against oneDNN's (`linear.py`).
They are compiled with the first C compiler found (`$CC`, `cc`, `gcc`) for the widest instruction set
the CPU reports (AVX-512, else AVX2, else none), cached per CPU and source, and only trusted once the
attention probe's child has run them against its fp32 reference (`attention.py`).
No compiler: the kernel is not offered, and the probe picks among the others.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from uniagent import cpu

_HERE = Path(__file__).parent
# One library: the decode products, the prefill kernel (AVX-512 builds only; elsewhere it says so) and
# a decode step's fp32 weight products (`linear_native.c`, taken where the linear probe picks them).
SOURCES = (_HERE / "attention_native.c", _HERE / "attention_prefill.c", _HERE / "linear_native.c")
HEADER = _HERE / "attention_native.h"
# (name, the CPU flag it needs, compiler flags): the first whose flag this CPU reports is built.
VARIANTS = (
    ("avx512bf16", "avx512_bf16", ["-mavx512f", "-mavx512bf16", "-mavx2", "-mfma"]),
    ("avx512", "avx512f", ["-mavx512f", "-mavx2", "-mfma"]),
    ("avx2", "avx2", ["-mavx2", "-mfma"]),
    ("generic", "", []),
)
MAX_DIM = 512


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in (*SOURCES, HEADER):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def compiler() -> str | None:
    for name in (os.environ.get("CC", ""), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def variants() -> list[tuple[str, list[str]]]:
    """The builds this CPU reports it can run, widest first (the probe times each: wider is not always
    faster, e.g. where AVX-512 runs as two 256-bit halves)."""
    have = set(cpu.flags())
    found = [(name, flags) for name, need, flags in VARIANTS if not need or need in have]
    if "avx512_bf16" in have:  # the same decode code as plain AVX-512, plus bf16 pairs in prefill
        found = [(name, flags) for name, flags in found if name != "avx512"]
    return found


def build(name: str, flags: list[str]) -> tuple[Path | None, str]:
    """The kernel's shared library built with `flags` for this CPU (built once, then reused), or None
    and why not."""
    cc = compiler()
    if cc is None:
        return None, "no C compiler (CC, cc or gcc) to build it"
    path = cpu.cache_root() / "cpu" / f"attention-native-{cpu.cpu_id()}-{source_hash()}-{name}.so"
    if path.exists():
        return path, ""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = Path(tmp) / path.name
        cmd = [cc, "-O3", "-fPIC", "-shared", "-fopenmp", *flags, *map(str, SOURCES), "-o", str(built)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            return None, f"{cc} failed: {proc.stderr.strip()[-200:]}"
        os.replace(built, path)  # whole or not at all: a concurrent start never loads half a file
    return path, ""


@functools.cache
def load(path: str) -> ctypes.CDLL | None:
    """The built library at `path`, loaded once per process; None where it is gone (a cleared cache):
    callers then take the matmul path rather than fail a decode step."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for fn in (lib.ua_scores, lib.ua_weighted, lib.ua_scores_f32, lib.ua_weighted_f32):
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 8 + [ctypes.c_int]
        fn.restype = None
    lib.ua_prefill.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_long] * 18 + [ctypes.c_float, ctypes.c_int]
    lib.ua_prefill.restype = ctypes.c_int
    lib.ua_linear_f32.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
    lib.ua_linear_f32.restype = None
    return lib


def fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether the kernel takes these operands: a bf16 or fp32 CPU cache with contiguous head dims."""
    dim = query.shape[-1]
    return (
        key.dtype == value.dtype
        and key.dtype in (torch.bfloat16, torch.float32)
        and key.device.type == "cpu"
        and key.stride(-1) == value.stride(-1) == 1
        and dim % 16 == 0
        and dim <= MAX_DIM
    )


def scores(lib: ctypes.CDLL, q: torch.Tensor, key: torch.Tensor, out: torch.Tensor) -> None:
    """out[r, h, g, j] = q[r, h, g] . key[r, h, j]; q and out contiguous fp32, [rows, kv_heads, group, *]."""
    rows, heads, group, dim = q.shape
    fn = lib.ua_scores_f32 if key.dtype == torch.float32 else lib.ua_scores
    fn(q.data_ptr(), key.data_ptr(), out.data_ptr(), rows, heads, group, key.shape[2], dim,
                  *key.stride()[:3], torch.get_num_threads())  # fmt: skip


def weighted(lib: ctypes.CDLL, p: torch.Tensor, value: torch.Tensor, out: torch.Tensor) -> None:
    """out[r, h, g] = sum_j p[r, h, g, j] * value[r, h, j]; p and out contiguous fp32."""
    rows, heads, group, keys = p.shape
    fn = lib.ua_weighted_f32 if value.dtype == torch.float32 else lib.ua_weighted
    fn(p.data_ptr(), value.data_ptr(), out.data_ptr(), rows, heads, group, keys, value.shape[-1],
                    *value.stride()[:3], torch.get_num_threads())  # fmt: skip


def prefill(
    lib: ctypes.CDLL,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
) -> torch.Tensor | None:
    """Attention of many queries per row, `query` [rows, heads, queries, dim] over grouped `key`/`value`
    [rows, kv_heads, keys, dim], all bf16 (`attention_prefill.c`); `mask` boolean (True attends),
    broadcastable to [rows, 1, queries, keys], or None with `causal` as SDPA's `is_causal`. Returns
    [rows, queries, heads, dim] (the layout attention modules hand on), or None where the kernel does
    not take these operands or this build has none: the caller runs SDPA."""
    rows, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    if not (
        query.dtype == key.dtype == value.dtype == torch.bfloat16
        and query.device.type == "cpu"
        and query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
        and dim % 64 == 0
        and dim <= 256
        and heads % kv_heads == 0
        and heads // kv_heads <= 16
    ):
        return None
    m_ptr, m_row, m_pos = None, 0, 0
    if mask is not None:
        if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
            return None
        mask = mask.expand(rows, 1, queries, keys)
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
        m_ptr, m_row, m_pos = mask.data_ptr(), mask.stride(0), mask.stride(2)
    out = torch.empty(rows, queries, heads, dim, dtype=torch.bfloat16)
    done = lib.ua_prefill(
        query.data_ptr(), key.data_ptr(), value.data_ptr(), m_ptr, out.data_ptr(),
        rows, heads, kv_heads, queries, keys, dim,
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], m_row, m_pos,
        0 if causal else -1, scale, torch.get_num_threads(),
    )  # fmt: skip
    return out if done == 0 else None
