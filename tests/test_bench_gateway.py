"""bench/gateway.py at a tiny size (2 requests per conversation, one repeat after the warm-up): the
gateway, the in-process peer and the direct engine each print their figure."""

from __future__ import annotations

import pytest

from bench_helpers import figures, run_bench


@pytest.mark.slow
def test_tiny_run_prints_the_overhead_at_1_and_50_sessions():
    rows = run_bench("gateway.py", "--turns", "2", "--repeats", "1")
    assert figures(rows)["direct_engine_us"] > 0 and figures(rows)["token_chat_model_us"] > 0
    for sessions in (1, 50):
        got = figures(rows, sessions=sessions)
        assert got["gateway_request_us"] > 0 and got["gateway_requests_per_s"] > 0
        assert got["gateway_handler_us"] > 0 and "gateway_overhead_us" in got
