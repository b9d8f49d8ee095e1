"""Build llama.cpp's `llama-server` for this CPU, and trust a binary only once it has generated here.

A binary that builds is not a binary that works: on an AMX Xeon the natively built server
segfaulted on its first matrix multiply (ggml's AMX kernels, at an `ldtilecfg`), although the
kernel reported and granted AMX. So every build, and every cached binary met on a CPU it has not
run on, is smoke-tested (`smoke`: load the packaged GGUF, generate a few tokens on loopback)
before `current` may point at it. A variant that fails is recorded with why, and the next one is
built:

1. `native`: `-march=native`, every instruction set this CPU reports;
2. `native-noamx`: the same without AMX (`-mno-amx-*`; only tried on a CPU that reports AMX);
3. `portable`: `GGML_NATIVE=OFF`, llama.cpp's AVX2-class default.

Cache (`cache_root()` = `${UNIAGENT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/uniagent}/llama-server`):
`<version>-<variant>-<hash>/llama-server`, the hash over the variant's cmake options, the compiler
and this CPU's id, so builds of different variants or CPUs never share a key; beside each binary
`verified.json` (CPU id -> smoke result). `choice.json` says which variant `current` links to and
why the ones before it were passed over; `uniagent doctor` shows it.

Source: the llama.cpp that the `llama-cpp-python` sdist (MIT) vendors under vendor/llama.cpp,
fetched from PyPI with this Python's pip (no git clone, no other registry). Only the server target
is built, without the web UI download, OpenSSL or libcurl.

Run: `python -m uniagent.models.remote.llama_build [--print-key] [--variant NAME]` (what
`scripts/build-llama-server.sh` and `make llama-server` do); prints the chosen binary's path.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from uniagent import cpu
from uniagent.jsonio import atomic_path, write_json_atomic
from uniagent.models.remote.llama_command import default_gguf, free_port, server_command

VERSION = "0.3.36"  # llama-cpp-python, whose sdist vendors the llama.cpp we build
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# What the server does not need is off: tests, examples, the other tools, the web UI (its assets
# would be downloaded at build time), OpenSSL (loopback HTTP only), shared libraries (one binary).
BASE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_ALL_WARNINGS=OFF",
)


@dataclass(frozen=True)
class Variant:
    name: str
    options: tuple[str, ...]
    about: str

    def applies(self, flags: list[str]) -> bool:
        """`native-noamx` only differs from `native` where the CPU has AMX."""
        return self.name != "native-noamx" or any(f.startswith("amx") for f in flags)


VARIANTS = (
    Variant("native", ("-DGGML_NATIVE=ON",), "every instruction set this CPU reports"),
    Variant(
        "native-noamx",
        (
            "-DGGML_NATIVE=ON",
            "-DGGML_AMX_TILE=OFF",
            "-DGGML_AMX_INT8=OFF",
            "-DGGML_AMX_BF16=OFF",
            f"-DCMAKE_C_FLAGS={_NO_AMX}",
            f"-DCMAKE_CXX_FLAGS={_NO_AMX}",
        ),
        "this CPU's instruction sets without AMX",
    ),
    Variant("portable", ("-DGGML_NATIVE=OFF",), "llama.cpp's portable AVX2-class build"),
)


def cache_root() -> Path:
    return cpu.cache_root() / "llama-server"


def _compiler() -> str:
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "none"
    return (out.splitlines() or ["none"])[0]


def key(variant: Variant, compiler: str | None = None) -> str:
    text = "\n".join([*BASE_OPTIONS, *variant.options, compiler or _compiler(), cpu.cpu_id()])
    return f"{VERSION}-{variant.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


# -- smoke test ---------------------------------------------------------------------------------


@dataclass
class Smoke:
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def smoke(binary: str, timeout_s: float = 120.0, gguf: str | None = None) -> Smoke:
    """Start `binary` on loopback with the packaged GGUF and generate 4 tokens (synchronous: doctor and
    `find_binary` call it outside any event loop). A crash says which signal killed it."""
    port = free_port()
    command = server_command(
        binary,
        default_gguf() if gguf is None else gguf,
        host="127.0.0.1",
        port=port,
        slots=1,
        ctx_size=256,
        threads=min(2, os.cpu_count() or 1),
    )
    log = cache_root() / f".smoke-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    try:
        return _exercise(proc, f"http://127.0.0.1:{port}", t0 + timeout_s, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        with contextlib.suppress(OSError):
            log.unlink()


def _exercise(proc: subprocess.Popen[bytes], url: str, deadline: float, log: Path) -> Smoke:
    def died() -> Smoke:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])[-300:]
        return Smoke(False, f"{cpu.signal_text(proc.returncode)} ({tail})")

    with httpx.Client(timeout=5.0) as client:
        while True:  # up and healthy (503 while the model loads)
            if proc.poll() is not None:
                return died()
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{url}/health").status_code == 200:
                    break
            if time.monotonic() > deadline:
                return Smoke(False, "not healthy in time")
            time.sleep(0.05)
        body = {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0.0}
        try:
            reply = client.post(f"{url}/completion", json=body, timeout=max(5.0, deadline - time.monotonic()))
            data = reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            time.sleep(0.2)
            return died() if proc.poll() is not None else Smoke(False, f"no completion: {exc!r}")
    n = int(data.get("tokens_predicted") or 0)
    if reply.status_code != 200 or n < 1:
        return Smoke(False, f"HTTP {reply.status_code}, {n} tokens: {str(data)[:200]}")
    return Smoke(True, f"generated {n} tokens")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def verified(binary: Path, check: Callable[[str], Smoke] | None = None) -> Smoke:
    """The binary's smoke result on this CPU: recorded beside it, or run now (`check`, default
    `smoke`) and recorded."""
    stamp = binary.parent / "verified.json"
    seen = read_json(stamp).get(cpu.cpu_id())
    if isinstance(seen, dict) and "ok" in seen:
        return Smoke(bool(seen["ok"]), str(seen.get("detail", "")))
    result = (check or smoke)(str(binary))
    records = read_json(stamp)  # read again: another process may have recorded its CPU meanwhile
    records[cpu.cpu_id()] = result.to_dict()
    with contextlib.suppress(OSError):
        write_json_atomic(stamp, records)
    return result


# -- build --------------------------------------------------------------------------------------


def _say(text: str) -> None:
    print(f"build-llama-server: {text}", file=sys.stderr, flush=True)


def build(variant: Variant, dest: Path, jobs: int) -> None:
    """Download the sdist (once per work folder), configure and build the server target, install the
    binary at `dest/llama-server`. The work folder survives a failure so a rerun resumes it."""
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"build-llama-server: '{tool}' is missing (apt-get install cmake g++)")
    work = cache_root() / f".work-{dest.name}"
    src = work / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if not (work / ".extracted").exists():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        _say(f"downloading the llama-cpp-python {VERSION} sdist")
        subprocess.run(
            [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "download", "--no-deps",
             "--no-binary", ":all:", f"llama-cpp-python=={VERSION}", "-d", str(work)],
            check=True, stdout=sys.stderr,
        )  # fmt: skip
        archive = work / f"llama_cpp_python-{VERSION}.tar.gz"
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        archive.unlink()
        (work / ".extracted").touch()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    ccache = "-DGGML_CCACHE=" + ("ON" if shutil.which("ccache") else "OFF")
    _say(f"building {dest.name} ({variant.about}) with {jobs} jobs (several minutes on 2 cores)")
    steps = [
        (["cmake", "-S", str(src), "-B", str(work / "build"), *generator, *BASE_OPTIONS, *variant.options,
          ccache], work / "cmake.log"),
        (["cmake", "--build", str(work / "build"), "--target", "llama-server", "-j", str(jobs)],
         work / "build.log"),
    ]  # fmt: skip
    for cmd, log in steps:
        with open(log, "wb") as out:
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                sys.stderr.write("\n".join(log.read_text(errors="replace").splitlines()[-40:]) + "\n")
                raise SystemExit(f"build-llama-server: {' '.join(cmd[:2])} failed (log: {log})")
    dest.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest / "llama-server") as tmp:
        shutil.copy2(work / "build" / "bin" / "llama-server", tmp)
    shutil.copy2(src / "LICENSE", dest / "LICENSE")
    shutil.rmtree(work, ignore_errors=True)


def _link_current(name: str) -> None:
    root = cache_root()
    with contextlib.suppress(OSError):
        if os.readlink(root / "current") == name:
            return
    with atomic_path(root / "current") as tmp:
        tmp.symlink_to(name)


def ensure(
    variants: tuple[Variant, ...] = VARIANTS,
    jobs: int | None = None,
    builder: Callable[[Variant, Path, int], None] = build,
    check: Callable[[str], Smoke] | None = None,
) -> Path:
    """The first variant, in order, that builds (or is cached) and passes the smoke test on this CPU;
    `current` links to it and `choice.json` records the choice and what was passed over."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    flags = cpu.flags()
    compiler = _compiler()
    passed_over: dict[str, str] = {}
    with open(root / ".lock", "w") as lock:  # one build at a time per cache
        fcntl.flock(lock, fcntl.LOCK_EX)
        for variant in (v for v in variants if v.applies(flags)):
            dest = root / key(variant, compiler)
            binary = dest / "llama-server"
            if not os.access(binary, os.X_OK):
                t0 = time.monotonic()
                builder(variant, dest, jobs or os.cpu_count() or 1)
                _say(f"built {dest.name} in {time.monotonic() - t0:.0f} s")
            result = verified(binary, check)
            if result.ok:
                if passed_over:
                    _say(f"chose {variant.name}: " + "; ".join(f"{k} {v}" for k, v in passed_over.items()))
                _link_current(dest.name)
                record = {
                    "variant": variant.name,
                    "key": dest.name,
                    "cpu": cpu.cpu_id(),
                    "about": variant.about,
                    "smoke": result.detail,
                    "passed_over": passed_over,
                }
                if read_json(root / "choice.json") != record:
                    write_json_atomic(root / "choice.json", record)
                return binary
            _say(f"the {variant.name} build fails on this CPU ({result.detail}); trying the next variant")
            passed_over[variant.name] = result.detail
    raise SystemExit(f"build-llama-server: no variant works on this CPU: {passed_over}")


def choice() -> dict[str, Any]:
    """What `ensure` chose last (`{}` before any build)."""
    return read_json(cache_root() / "choice.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print-key", action="store_true", help="print the first variant's cache key")
    parser.add_argument("--variant", choices=[v.name for v in VARIANTS], help="build only this variant")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS") or 0) or None)
    args = parser.parse_args(argv)
    variants = tuple(v for v in VARIANTS if args.variant in (None, v.name))
    if args.print_key:
        print(key(variants[0]))
        return 0
    print(ensure(variants, args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
