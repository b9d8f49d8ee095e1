"""torch's kernels are probed on this CPU before they are trusted, with a fallback (issue 25 part 1).

The crash is staged by the probe child itself (a setting whose environment makes it die of SIGSEGV,
as oneDNN's AMX path could on a CPU that reports AMX); the chooser must pass over it, say why, cache
the choice per CPU and torch version, and put its environment in place without overriding the user.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from uniagent import cpu, doctor

CRASH = "import os, signal\nif os.environ.get('PROBE_CRASH'):\n    os.kill(os.getpid(), signal.SIGSEGV)\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNIAGENT_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu, "_applied", None)
    return tmp_path


def test_a_setting_whose_child_crashes_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "_PROBE", CRASH + cpu._PROBE)
    settings = (("default", {"PROBE_CRASH": "1"}), ("no-amx", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}))
    choice = cpu.probe_torch(settings)
    assert choice.setting == "no-amx" and choice.env == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    assert "SIGSEGV" in choice.tried["default"] and "fell back" in choice.describe()
    assert choice.fp32_gflops > 0 and choice.bf16_gflops > 0 and choice.capability


def test_every_setting_failing_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "_PROBE", CRASH + cpu._PROBE)
    with pytest.raises(RuntimeError, match="SIGSEGV"):
        cpu.probe_torch((("default", {"PROBE_CRASH": "1"}),))


def test_the_choice_is_cached_per_cpu_and_applied_under_the_users_settings(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged = cpu.TorchChoice(
        "no-amx", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "ATEN_CPU_CAPABILITY": "avx2"}
    )
    calls: list[int] = []
    monkeypatch.setattr(cpu, "probe_torch", lambda: calls.append(1) or staged)
    assert cpu.torch_choice().setting == "no-amx" and cpu.torch_choice().setting == "no-amx"
    assert calls == [1]  # probed once, then read back
    stored = list((cache / "cpu").glob(f"torch-{cpu.cpu_id()}-*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["setting"] == "no-amx"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # the user's own setting wins
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert cpu.apply_torch_choice() is not None
    assert (
        os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
        and os.environ["ATEN_CPU_CAPABILITY"] == "default"
    )
    monkeypatch.setattr(cpu, "cpu_id", lambda: "another-cpu")
    assert cpu.torch_choice().setting == "no-amx" and calls == [1, 1]  # another CPU: probed again


def test_doctor_reports_what_was_chosen(cache: Path) -> None:
    rows = {c.name: c for c in doctor.cpu_checks()}
    assert rows["cpu"].ok and "matrix units" in rows["cpu"].detail
    assert rows["torch kernels"].ok and rows["torch kernels"].detail.startswith("default")
    assert "llama-server build" in rows
    assert rows["model.dtype auto"].detail.split()[0] in ("bfloat16", "float32")  # with the measured ratio
    assert "fp32 here" in rows["model.dtype auto"].detail


def test_a_thread_lets_its_openmp_threads_go() -> None:
    """`release_openmp_team` ends the helper threads a thread's parallel torch work started (libgomp,
    the runtime torch ships here), and they come back with the next parallel op."""
    import threading
    import time

    import torch

    def tasks() -> int:
        return len(os.listdir("/proc/self/task"))

    counts: dict[str, object] = {}

    def work() -> None:
        a = torch.randn(512, 512)
        _ = a @ a  # a parallel region: this thread's team is started
        counts["busy"] = tasks()
        counts["released"] = cpu.release_openmp_team()
        deadline = time.monotonic() + 5
        while tasks() >= counts["busy"] and time.monotonic() < deadline:  # helpers exit asynchronously
            time.sleep(0.01)
        counts["idle"] = tasks()
        _ = a @ a
        counts["again"] = tasks()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert counts["released"] is True
    helpers = torch.get_num_threads() - 1
    assert counts["busy"] - counts["idle"] == helpers  # type: ignore[operator]
    assert counts["again"] == counts["busy"]
