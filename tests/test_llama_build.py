"""A llama-server that builds is not trusted until it has generated on this CPU (issue 25 part 1).

The fallback is driven here with stub builds (a real build takes minutes): the `native` stub
"crashes" in its smoke test the way ggml's AMX kernels did on an AMX Xeon, and the chooser must move
on to the next variant, record why, key the builds apart, and not rebuild or re-test on a second run.
The smoke test itself runs for real: on a stub that dies of SIGSEGV, and on the cached real build.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import require
from uniagent import cpu
from uniagent.errors import EngineError
from uniagent.models.remote import llama_build
from uniagent.models.remote.llama_build import VARIANTS, Smoke, ensure, key, smoke
from uniagent.models.remote.llama_server import find_binary


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNIAGENT_CACHE", str(tmp_path))
    monkeypatch.delenv("UNIAGENT_LLAMA_SERVER", raising=False)
    return tmp_path / "llama-server"


def _stub(dest: Path, body: str = "exit 0") -> None:
    dest.mkdir(parents=True, exist_ok=True)
    binary = dest / "llama-server"
    binary.write_text(f"#!/bin/sh\n{body}\n")
    binary.chmod(0o755)


class Recorder:
    """A builder that writes stubs and a smoke check that fails the variants named in `crash`."""

    def __init__(self, crash: set[str]) -> None:
        self.crash = crash
        self.built: list[str] = []
        self.checked: list[str] = []

    def build(self, variant: llama_build.Variant, dest: Path, jobs: int) -> None:
        self.built.append(variant.name)
        _stub(dest)

    def check(self, binary: str) -> Smoke:
        name = next(v.name for v in sorted(VARIANTS, key=lambda v: -len(v.name)) if f"-{v.name}-" in binary)
        self.checked.append(name)
        if name in self.crash:
            return Smoke(False, "killed by SIGSEGV (ggml_backend_amx_mul_mat)")
        return Smoke(True, "generated 4 tokens")


def test_a_crashing_native_build_falls_back_without_amx(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "flags", lambda: ["avx512f", "amx_tile", "amx_int8", "amx_bf16"])
    rec = Recorder(crash={"native"})
    chosen = ensure(builder=rec.build, check=rec.check)
    assert rec.built == ["native", "native-noamx"] and rec.checked == ["native", "native-noamx"]
    assert chosen.parent.name == key(VARIANTS[1]) and "-native-noamx-" in chosen.parent.name
    assert (cache / "current").resolve() == chosen.parent
    record = json.loads((cache / "choice.json").read_text())
    assert record["variant"] == "native-noamx" and "SIGSEGV" in record["passed_over"]["native"]
    # Both verdicts are kept beside their binaries, per CPU: a second run builds and tests nothing.
    for variant, ok in (("native", False), ("native-noamx", True)):
        stamp = json.loads(
            (cache / key(next(v for v in VARIANTS if v.name == variant)) / "verified.json").read_text()
        )
        assert stamp[cpu.cpu_id()]["ok"] is ok
    again = Recorder(crash={"native"})
    assert ensure(builder=again.build, check=again.check) == chosen
    assert again.built == [] and again.checked == []


def test_without_amx_the_fallback_is_the_portable_build(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "flags", lambda: ["avx2", "avx512f"])
    rec = Recorder(crash={"native"})
    chosen = ensure(builder=rec.build, check=rec.check)
    assert rec.built == ["native", "portable"] and "-portable-" in chosen.parent.name


def test_no_working_variant_is_an_error_naming_each(cache: Path) -> None:
    rec = Recorder(crash={v.name for v in VARIANTS})
    with pytest.raises(SystemExit, match="no variant works on this CPU"):
        ensure(builder=rec.build, check=rec.check)
    assert not (cache / "current").exists()


def test_keys_tell_variants_and_cpus_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = {key(v, "c++ 12") for v in VARIANTS}
    assert len(keys) == len(VARIANTS)
    here = key(VARIANTS[0], "c++ 12")
    monkeypatch.setattr(cpu, "cpu_id", lambda: "another-cpu")
    assert key(VARIANTS[0], "c++ 12") != here


def test_a_cached_binary_from_another_cpu_is_tested_before_it_is_used(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = cache / key(VARIANTS[0])
    _stub(dest)
    (dest / "verified.json").write_text(json.dumps({"another-cpu": {"ok": True, "detail": "there"}}))
    (cache / "current").symlink_to(dest.name)
    monkeypatch.setattr(llama_build, "smoke", lambda binary: Smoke(False, "killed by SIGILL"))
    with pytest.raises(EngineError, match=r"does not work on this CPU.*SIGILL"):
        find_binary()
    assert json.loads((dest / "verified.json").read_text())[cpu.cpu_id()]["ok"] is False
    monkeypatch.setattr(llama_build, "smoke", lambda binary: pytest.fail("tested twice"))
    with pytest.raises(EngineError):  # the verdict is recorded: not re-tested on every lookup
        find_binary()


def test_the_smoke_test_names_the_signal_a_binary_dies_of(cache: Path, tmp_path: Path) -> None:
    _stub(tmp_path / "bad", "kill -SEGV $$")
    result = smoke(str(tmp_path / "bad" / "llama-server"), timeout_s=30)
    assert not result.ok and "SIGSEGV" in result.detail


def test_the_real_build_generates_on_this_cpu() -> None:
    binary = find_binary()
    require("llama-server", binary is not None, "build it with `make llama-server`")
    assert binary is not None
    result = smoke(os.path.realpath(binary), timeout_s=120)
    assert result.ok, result.detail
