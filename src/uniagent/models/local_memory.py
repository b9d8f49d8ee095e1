"""The memory budget of `LocalEngine`: what the machine gives, what a batch will need, and glibc's part.

Why it works this way (measured on the 24 GB, 2-core machine, `uniagent run --tasks builtin:starter
--model local --concurrency 18 --max-turns 3`, issue 25 part 6):

- The process grew in steps (1.2 -> 2.9 -> 4.5 -> 6.3 GB) at each admission while the live keys/values
  were 0.85 -> 1.25 GB and kept prefixes 0.1 GB. Two causes. (1) glibc keeps freed heap: once a large
  block is freed its mmap threshold rises to 32 MiB, so every later per-layer buffer (a 16-row x 1,800
  column layer is 21 MiB) comes from the heap, and the copies each merge and regrowth frees stay in the
  process. Replaying the engine's allocation pattern: 3.6 GB resident for 1.4 GB live by default, 1.6 GB
  with a fixed 1 MiB threshold. (2) Nothing bounded the bytes: admission
  counted worst-case tokens (prompt + max_tokens) but every row of a batch is padded to the longest
  (right-aligned columns), a merge held both caches and the merged one at once, and a long prefill ran
  all its columns in one forward (per padded token ~30 KiB of activations, plus a [rows, q, kv] mask).
- So the engine has one budget (`memory_budget_bytes`): the keys/values of the running batch at their
  worst (every row padded to the widest, grown by the most tokens any row may still sample), the new
  rows' prefill cache and activations while they are admitted, and the kept prefixes. Admission adds a
  request only while `MemoryPlan.admission_peak` plus the kept prefixes fit; kept prefixes are evicted
  (least recently used) before running work is refused; what does not fit waits in the queue. A request
  that would not fit even alone runs alone once nothing else runs (the prefixes all dropped), with a
  warning: refusing it would fail it on every machine.
- The default is half of what the machine has at start (MemAvailable, or what the cgroup still allows
  when that is less): the weights, the framework, sandboxes and tool processes live in the other half.
- That 1 MiB threshold had a price, measured later (bench/roofline.py's machine, 2 threads, bf16): every
  activation of 1 MiB or more was a fresh mmap, faulted in page by page and unmapped when freed. A 4K
  prefill took 330K page faults and 0.6 s of kernel time (2.37 s instead of 1.90 s), a training update
  of four 1K-token rows 17M faults (11.0 s instead of 9.5 s on the trainer's thread). So the two kinds of
  memory now take two paths: keys/values (long-lived, the memory that must go back when a row ends) are
  anonymous mappings of their own (kv.py's `mapped_zeros`: unmapped when the tensor is freed, whatever glibc
  does), and everything else, short-lived activations, stays in glibc's heap and is reused
  (`tune_malloc`: mmap threshold 32 MiB, trim threshold 256 MiB). A trainer still hands freed heap back
  between steps (`malloc_trim`, train/outputs.py's `release_memory`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uniagent.models.kv import Dims

log = logging.getLogger(__name__)

BUDGET_FRACTION = 0.5  # of the memory available at start, when no budget is set
PREFIX_FRACTION = 0.25  # of the budget kept prefixes may hold, when no prefix cap is set
MMAP_THRESHOLD = 32 << 20  # glibc's largest: activations below it are reused from the heap
TRIM_THRESHOLD = 256 << 20  # free heap kept at its top before glibc gives it back (one step's activations)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def machine_available() -> tuple[int, str]:
    """Bytes this process may still take, and where the figure comes from: /proc/meminfo's
    MemAvailable, or the cgroup's limit minus its usage (v2 or v1) where that is less."""
    best, source = _meminfo_available(), "MemAvailable"
    for limit, usage, name in _cgroup_limits():
        if limit - usage < best:
            best, source = max(0, limit - usage), name
    return best, source


def _meminfo_available() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 * 1024**3  # not Linux: assume a small machine


def _cgroup_limits() -> list[tuple[int, int, str]]:
    """(limit, usage, name) of the cgroups this process is in that set a memory limit."""
    out: list[tuple[int, int, str]] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":  # v2
                base = Path("/sys/fs/cgroup") / path.lstrip("/")
                files, name = ("memory.max", "memory.current"), "cgroup v2 memory.max"
            elif "memory" in controllers.split(","):
                base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
                files, name = ("memory.limit_in_bytes", "memory.usage_in_bytes"), "cgroup memory limit"
            else:
                continue
            with contextlib.suppress(OSError, ValueError):
                raw = (base / files[0]).read_text().strip()
                if raw != "max" and int(raw) < 1 << 60:
                    out.append((int(raw), int((base / files[1]).read_text().strip()), name))
    return out


def resolve_budget(budget_bytes: int | None) -> tuple[int, str]:
    """The budget to use and a phrase saying where it came from (for the start log and doctor)."""
    if budget_bytes is not None:
        return int(budget_bytes), "set"
    available, source = machine_available()
    return int(available * BUDGET_FRACTION), f"{BUDGET_FRACTION:.0%} of {gib(available)} ({source})"


def resolve_prefix_cap(prefix_bytes: int | None, budget_bytes: int) -> int:
    """Kept prefixes hold at most this much; always within the memory budget."""
    cap = int(budget_bytes * PREFIX_FRACTION) if prefix_bytes is None else int(prefix_bytes)
    return max(0, min(cap, budget_bytes))


def gib(n: float) -> str:
    return f"{n / 1024**3:.2f} GiB"


def tune_malloc() -> bool:
    """glibc's heap policy for a process that runs a model (see the module docstring): activations stay
    in the heap and are reused, keys/values live in their own mappings. Process-wide, set by every
    `LocalEngine`; False where it is not glibc."""
    libc = _libc()
    if libc is None:
        return False
    try:
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        )
    except AttributeError:
        return False


def trim_heap() -> None:
    """Give the heap's free pages back to the system now (glibc's malloc_trim; a no-op elsewhere)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@dataclass(frozen=True)
class Running:
    """What admission needs to know of the running batch: rows, columns allocated and in use, and the
    most tokens any of its rows may still sample."""

    rows: int
    capacity: int
    width: int
    remaining: int


@dataclass(frozen=True)
class Incoming:
    """One request as admission sees it: its prompt, how much of it is reused, its token cap."""

    prompt: int
    reused: int
    max_tokens: int


@dataclass(frozen=True)
class MemoryPlan:
    """Byte estimates for a model's batches (keys/values exact, activations an upper bound measured on
    SmolLM2: ~30 KiB per padded prefill token in fp32 against 4 * (4 * hidden + 3 * intermediate))."""

    bytes_per_token: int  # keys + values of one token over every layer
    layers: int
    activation_per_token: int  # one padded prefill token's live activations
    spare: int  # decode columns reserved past a prefill or merge (`local_batch._SPARE`)
    chunk: int  # columns a full buffer grows by (`kv._CHUNK`)

    @classmethod
    def of(cls, dims: Dims, config: object, spare: int, chunk: int) -> MemoryPlan:
        hidden = int(getattr(config, "hidden_size", 0) or 0)
        inter = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
        element = dims.bytes_per_token // (2 * dims.layers * dims.kv_heads * dims.head_dim)
        return cls(
            bytes_per_token=dims.bytes_per_token,
            layers=dims.layers,
            activation_per_token=max(4, element) * (4 * hidden + 3 * inter),
            spare=spare,
            chunk=chunk,
        )

    def kv(self, rows: int, columns: int) -> int:
        return rows * columns * self.bytes_per_token

    def prefill_activations(self, rows: int, queries: int, keys: int) -> int:
        """One prefill forward of `queries` columns over `keys` columns: activations and its mask
        (a bool [rows, queries, keys] and the float copy attention may make of it)."""
        return rows * queries * (self.activation_per_token + 5 * keys)

    def chunk_columns(self, rows: int, max_tokens: int) -> int:
        """Columns per prefill forward so that rows x columns stays within `max_tokens` padded tokens."""
        return max(16, max_tokens // max(1, rows))

    def admission_peak(self, running: Running | None, new: list[Incoming], prefill_tokens: int) -> int:
        """The most bytes the engine's keys/values and activations reach from admitting `new` next to
        `running` until every row ends: the larger of the admission (old cache + the prefill's cache
        and one chunk's activations; a merge copies layer by layer) and the merged batch at its widest."""
        old = running or Running(0, 0, 0, 0)
        if not new:
            return self.kv(old.rows, max(old.capacity, old.width + old.remaining + self.chunk))
        past = max(r.reused for r in new)
        width = max(r.prompt - r.reused for r in new)
        spare = min(max(r.max_tokens for r in new), self.spare) + 1
        prefill_cache = self.kv(len(new), past + width + spare)
        columns = self.chunk_columns(len(new), prefill_tokens)
        activations = self.prefill_activations(len(new), min(width, columns), past + width + spare)
        rows = old.rows + len(new)
        merged_width = max(old.width, past + width)
        layer = self.kv(rows, merged_width + spare) // self.layers
        admitting = self.kv(old.rows, old.capacity) + prefill_cache + max(activations, layer)
        remaining = max(old.remaining, *(r.max_tokens for r in new))
        widest = self.kv(rows, merged_width + remaining + self.chunk) + layer  # + one layer regrown
        return max(admitting, widest)
