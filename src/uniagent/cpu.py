"""What this CPU can do, found by running it: probe at start, fall back, say what was chosen.

Machines of one kind differ in CPU, and a kernel picked by CPU feature can crash where the feature
is reported (llama.cpp's AMX kernels segfaulted on an AMX Xeon whose kernel granted AMX state). So
nothing chosen by CPU feature is trusted until it has run here once:

- `torch_choice()` runs fp32 and bf16 matmuls in a child interpreter with torch's defaults; if the
  child dies, it retries with oneDNN held below AMX (`ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`), then
  with torch's and oneDNN's kernels held to AVX2. The first setting that works is kept, cached per
  CPU and torch version (`cache_root()/cpu/`), and `apply_torch_choice()` puts its environment in
  place before torch runs its first kernel (the CLI's start, the engine's model load). A user's own
  `ONEDNN_MAX_CPU_ISA` / `ATEN_CPU_CAPABILITY` always wins.
- llama.cpp's server is built and smoke-tested the same way (`uniagent.models.remote.llama_build`).

`uniagent doctor` shows the CPU's matrix units and both choices.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from uniagent.jsonio import write_json_atomic

# The instruction sets that decide which kernels run (shown by doctor; part of the CPU's id).
MATRIX_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16",
                "amx_int8", "amx_fp16")  # fmt: skip
ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
T = TypeVar("T")


def cache_root() -> Path:
    """`$UNIAGENT_CACHE`, else `$XDG_CACHE_HOME/uniagent` (default `~/.cache/uniagent`)."""
    base = os.environ.get("UNIAGENT_CACHE")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "uniagent"


def flags() -> list[str]:
    """The CPU's feature flags as the kernel reports them (first CPU), or [] off Linux."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def model_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_id() -> str:
    """A short id of this CPU model and its flags: builds and probes are keyed by it, so a cached
    result from another CPU is never taken for this one's."""
    text = "\n".join([platform.machine(), model_name(), " ".join(flags())])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def matrix_units() -> list[str]:
    have = set(flags())
    return [f for f in MATRIX_FLAGS if f in have]


def signal_text(returncode: int | None) -> str:
    """'killed by SIGSEGV' for a negative return code, 'exit status N' otherwise."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


# Tried in order; the first whose child runs both matmuls is chosen.
TORCH_SETTINGS: tuple[tuple[str, dict[str, str]], ...] = (
    ("default", {}),
    ("no-amx", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}),
    ("avx2", {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}),
)
_PROBE = """
import time, torch
torch.set_num_threads(1)
out = {"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    a, b = torch.randn(256, 512, dtype=dt), torch.randn(512, 256, dtype=dt)
    (a @ b).sum().item()
    t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < 0.05:
        (a @ b).sum().item(); n += 1
    out[name + "_gflops"] = round(2 * 256 * 512 * 256 * n / (time.perf_counter() - t0) / 1e9, 1)
print("PROBE", __import__("json").dumps(out))
"""


@dataclass
class TorchChoice:
    """What the torch probe chose: the setting's name and environment, what it measured, and what
    failed before it (`tried`: setting -> why)."""

    setting: str
    env: dict[str, str]
    capability: str = ""
    fp32_gflops: float = 0.0
    bf16_gflops: float = 0.0
    tried: dict[str, str] = field(default_factory=dict)
    cpu: str = ""
    torch: str = ""

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items()) or "torch defaults"
        fell = "; ".join(f"{k}: {v}" for k, v in self.tried.items())
        return (
            f"{self.setting} ({env}), kernels {self.capability}, 1 thread fp32 {self.fp32_gflops:g} / bf16 "
            f"{self.bf16_gflops:g} GFLOP/s" + (f"; fell back after {fell}" if fell else "")
        )


def timed_us(fn: Callable[[], object], seconds: float = 0.15) -> float:
    """Median microseconds of `fn` over ~`seconds` (after a warm-up call): the kernel probes' timer."""
    fn()
    times: list[float] = []
    began = time.perf_counter()
    while time.perf_counter() - began < seconds or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[len(times) // 2] * 1e6, 1)


def run_probe(code: str, env: dict[str, str], timeout: float = 120.0) -> tuple[dict | None, str]:
    """Run `code` in a child interpreter under `env` (the ISA variables replaced): the JSON it printed on a
    `PROBE ` line, or None and why it gave none (a crash there cannot take this process down)."""
    child_env = {k: v for k, v in os.environ.items() if k not in ISA_ENV}
    child_env.update(env)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, f"no answer in {timeout:.0f} s"
    for line in proc.stdout.splitlines():
        if line.startswith("PROBE ") and proc.returncode == 0:
            return json.loads(line[6:]), ""
    tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
    return None, f"{signal_text(proc.returncode)}" + (f": {tail}" if tail else "")


def run_torch_probe(code: str, extra: dict[str, str] | None = None) -> tuple[dict | None, str]:
    """`run_probe` under the torch kernel setting this CPU runs (plus `extra`): the kernel probes' child.
    None and why also where that setting could not be found."""
    try:
        env = torch_choice().env
    except RuntimeError as exc:
        return None, f"the CPU probe failed: {exc}"
    return run_probe(code, {**env, **(extra or {})})


def probe_torch(settings: tuple[tuple[str, dict[str, str]], ...] = TORCH_SETTINGS) -> TorchChoice:
    """Try each setting in a child interpreter (a crash there cannot take this process down)."""
    tried: dict[str, str] = {}
    for name, env in settings:
        found, why = run_probe(_PROBE, env)
        if found is not None:
            return TorchChoice(
                name,
                dict(env),
                found["capability"],
                found["fp32_gflops"],
                found["bf16_gflops"],
                tried,
                cpu_id(),
                found["torch"],
            )
        tried[name] = why
    raise RuntimeError(f"torch cannot run a matmul on this CPU with any setting: {tried}")


def torch_version() -> str:
    """The installed torch's version without importing it ("none" when absent): part of cache keys."""
    import importlib.metadata as md

    try:
        return md.version("torch")
    except md.PackageNotFoundError:
        return "none"


def probe_path(name: str) -> Path:
    """Where a probe's finding for this CPU and torch is cached (`name`: the probe's)."""
    return cache_root() / "cpu" / f"{name}-{cpu_id()}-{torch_version()}.json"


def cached_probe(name: str, kind: type[T], probe: Callable[[], T], refresh: bool = False,
                 keep: Callable[[T], bool] = lambda _: True) -> T:  # fmt: skip
    """Probe `name`'s finding (a dataclass `kind`) for this CPU and torch: read from its cache file
    (`probe_path`), else measured by `probe` once and written there when `keep` says it may be reused
    (a probe that could not run is not cached: the next start tries again)."""
    path = probe_path(name)
    if not refresh:
        with contextlib.suppress(OSError, ValueError, TypeError):
            return kind(**json.loads(path.read_text()))
    found = probe()
    if keep(found):
        with contextlib.suppress(OSError):
            write_json_atomic(path, asdict(found))  # type: ignore[arg-type]
    return found


def torch_choice(refresh: bool = False) -> TorchChoice:
    """The cached choice for this CPU and torch, probed (a few seconds, once) when there is none."""
    return cached_probe("torch", TorchChoice, probe_torch, refresh)


_applied: TorchChoice | None = None


def apply_torch_choice() -> TorchChoice | None:
    """Put the chosen setting's environment in place (once per process; a variable the user set is
    kept). Call before torch runs its first kernel. `UNIAGENT_CPU_PROBE=0` skips the probe."""
    global _applied
    if _applied is not None or os.environ.get("UNIAGENT_CPU_PROBE", "1") == "0":
        return _applied
    try:
        choice = torch_choice()
    except RuntimeError:
        return None
    for key, value in choice.env.items():
        os.environ.setdefault(key, value)
    _applied = choice
    return choice


_gomp: list[ctypes.CDLL] = []  # the runtime once found (it stays loaded with torch)


def _libgomp() -> ctypes.CDLL | None:
    """The GNU OpenMP runtime this process already loaded (torch's), without loading one; None where
    there is none (torch not imported yet, another runtime, not Linux)."""
    if _gomp:
        return _gomp[0]
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "libgomp" in line and "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        with contextlib.suppress(OSError):
            _gomp.append(ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL))
            return _gomp[0]
    return None


def release_openmp_team() -> bool:
    """Let the calling thread's idle OpenMP threads go (libgomp's soft `omp_pause_resource_all`); its
    next parallel torch op starts them again (a fraction of a millisecond).

    Why: libgomp cuts every team's spin-wait to ~100 spins once it manages more threads than there are
    cores, i.e. as soon as a second thread of the process has run parallel torch work (an engine's
    worker and a trainer's update thread; a peer's forward on the main thread). Then a team's helper
    threads fall asleep between the hundreds of short parallel regions of a decode step, and each
    region waits for them to wake, even while the other team sits idle. Measured on 2 cores (AVX2
    EPYC, fp32 SmolLM2, 4 rows x 64 new tokens): 44.5 tokens/s alone, 30.9 after the main thread had
    run ten 512x512 matmuls, 49.1 when it then let its team go. So a thread that is done with torch
    for a while (an idle engine, a finished update) calls this. False where it cannot: no libgomp
    loaded, or called inside a parallel region."""
    lib = _libgomp()
    if lib is None or not hasattr(lib, "omp_pause_resource_all"):
        return False
    return lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0


_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: keeps the runtime, frees the threads
