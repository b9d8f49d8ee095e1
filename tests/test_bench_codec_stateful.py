"""bench/codec_stateful.py at a tiny size (~1.5K tokens, 2 repeats) on the real DeepSeek-V3 and
gpt-oss tokenizers: every method's figure with its spread, and an exact episode (seconds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import SHARED_TEMPLATES, require
from real_tokenizers import folder

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # the bench's modules import each other as scripts do

import codec_stateful  # noqa: E402


def test_tiny_run_times_each_method_and_is_exact(capsys, monkeypatch):
    for family in codec_stateful.CASES:
        folder(family)
    require("the shared chat templates", SHARED_TEMPLATES.is_dir(), f"{SHARED_TEMPLATES} is missing")
    monkeypatch.setenv("UNIAGENT_SHARED_DIR", str(SHARED_TEMPLATES.parent))
    rc = codec_stateful.main(["--tokens", "1500", "--repeats", "2"])
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert rc == 0 and all(r["bench"] == "codec_stateful" for r in rows)
    appends = {(r["family"], r["method"]): r for r in rows if r["figure"] == "append_us"}
    assert set(appends) == {
        ("deepseek_v3", "stateful"),
        ("deepseek_v3", "fast"),
        ("deepseek_v3", "full_plain"),
        ("gptoss", "stateful"),
        ("gptoss", "full_plain"),
    }
    for r in appends.values():
        assert len(r["runs"]) == 2 and r["min"] <= r["value"] <= r["max"] and r["tokens"] >= 1500
    exact = {r["family"]: r for r in rows if r["figure"] == "exact"}
    assert {f: r["value"] for f, r in exact.items()} == {"deepseek_v3": True, "gptoss": True}
    assert exact["deepseek_v3"]["kind"] == "stateful" and exact["gptoss"]["kind"] == "rewriting"
