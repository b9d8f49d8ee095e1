"""bench/remote.py at a tiny size (5 requests per peer): RemoteEngine against a raw HTTP call to the
same loopback server, for each dialect and both prompt lengths."""

from __future__ import annotations

from bench_helpers import figures, run_bench


def test_tiny_run_prints_engine_and_raw_figures_per_dialect():
    rows = run_bench("remote.py", "--requests", "5")
    for dialect in ("vllm", "sglang"):
        for prompt_tokens in (1500, 5000):
            got = figures(rows, dialect=dialect, prompt_tokens=prompt_tokens)
            assert got["raw_request_us"] > 0 and got["engine_request_us"] > 0
            assert got["engine_own_cpu_us"] != 0 and "engine_overhead_us" in got
