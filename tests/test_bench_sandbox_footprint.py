"""bench/sandbox_footprint.py at a tiny size (2 bubblewrap sandboxes): processes, memory and fds per
sandbox, idle and busy, and nothing left running after the stop."""

from __future__ import annotations

import pytest

from bench_helpers import run_bench
from conftest import needs_bwrap


@pytest.mark.slow
@needs_bwrap
def test_tiny_run_measures_each_sandbox_and_leaves_nothing():
    rows = run_bench("sandbox_footprint.py", "--n", "2", "--starts", "2")
    got = {(r["figure"], r.get("state")): r["value"] for r in rows}
    for state in ("idle", "busy"):
        assert got[("processes_per_sandbox", state)] >= 1
        assert got[("pss_mb_per_sandbox", state)] > 0
    assert got[("start_s", None)]["p50"] > 0
    assert got[("left_after_stop", None)] == 0
