"""The `uniagent` verbs not covered elsewhere: version, tasks list/show, demo, gateway served
through the CLI, and `run --backend ray --ray-address` against a Ray cluster this test starts."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from conftest import needs_bwrap, require_module
from dashboard_helpers import free_port
from run_helpers import starter_run
from uniagent import __version__, cli
from uniagent.demo import MAX_RESULT_BITS, calculate, run_tool
from uniagent.models.base import Generation
from uniagent.models.replay import ReplayRecord, save_records
from uniagent.parsers.base import ToolCall
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

CLI = [sys.executable, "-m", "uniagent.cli"]


def invoke(*args: str) -> Result:
    cli.console.width = 250  # one table row per line
    return CliRunner().invoke(cli.app, list(args))


# -- version, tasks ---------------------------------------------------------------------------
def test_version_in_a_fresh_process() -> None:
    proc = subprocess.run([*CLI, "version"], capture_output=True, text=True, check=True, timeout=120)
    assert proc.stdout.strip() == f"uniagent {__version__}"


def test_tasks_list_names_every_bundled_suite_with_its_size() -> None:
    from uniagent.tasks.registry import SUITES

    res = invoke("tasks", "list")
    assert res.exit_code == 0, res.output
    for name in SUITES:
        line = next(line for line in res.output.splitlines() if f"builtin:{name} " in line)
        assert f" {len(load_tasks(f'builtin:{name}'))} " in line, line


def test_tasks_show_a_suite_and_one_task() -> None:
    tasks = load_tasks("builtin:starter")
    res = invoke("tasks", "show", "builtin:starter")
    assert res.exit_code == 0, res.output
    assert f"builtin:starter: {len(tasks)} tasks" in res.output
    assert all(t.instance_id in res.output for t in tasks)
    one = tasks[0]
    res = invoke("tasks", "show", "builtin:starter", one.instance_id)
    assert res.exit_code == 0, res.output
    assert "problem_statement" in res.output and one.row["problem_statement"].splitlines()[0] in res.output


def test_tasks_show_an_unknown_suite_is_one_clear_line() -> None:
    proc = subprocess.run(
        [*CLI, "tasks", "show", "builtin:nope"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "builtin:starter" in proc.stderr


# -- demo ---------------------------------------------------------------------------------------
def calc(expression: str) -> str:
    return run_tool(ToolCall(name="calculator", arguments={"expression": expression}, id="c1"))


@pytest.mark.parametrize(
    ("expr", "want"),
    [("17 * 23", "391"), ("2 ** 10", "1024"), ("-(3 + 4) * 2", "-14"), ("7 / 2", "3.5"), ("7 // 2", "3")],
)
def test_calculator_does_arithmetic(expr: str, want: str) -> None:
    assert calc(expr) == want


@pytest.mark.parametrize(
    "expr", ["9**9**9**9", "9**9**9", "2**100000", "(10**1000)*(10**1000)*(10**1000)", "2.5**1e9"]
)
def test_calculator_refuses_huge_results_at_once(expr: str) -> None:
    """Before the bound, `9**9**9**9` hung the demo (Python computing a number with ~10^8 digits)."""
    started = time.perf_counter()
    out = calc(expr)
    assert out.startswith("error: "), out
    assert time.perf_counter() - started < 1.0


def test_calculator_bound_is_generous_for_honest_questions() -> None:
    assert calculate("2 ** 4000") == 2**4000
    assert calculate("3 ** 2 ** 3") == 6561  # right-associative, as in Python
    with pytest.raises(ValueError, match="too large"):
        calculate(f"2 ** {MAX_RESULT_BITS + 1}")
    with pytest.raises(ValueError):
        calculate("(" * 150 + "1" + ")" * 150)
    assert calc("__import__('os')").startswith("error: ")


def test_demo_runs_one_short_episode_with_the_real_model() -> None:
    res = invoke("demo", "--turns", "1", "--max-tokens", "4", "--no-show-tokens")
    assert res.exit_code == 0, res.output
    assert "trajectory (what the trainer receives)" in res.output
    assert "model_tokens" in res.output and "drift" in res.output and "drift_kind" in res.output


# -- gateway ------------------------------------------------------------------------------------
@contextlib.contextmanager
def process(argv: list[str], **kw: object) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw
    )  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_http(url: str, proc: subprocess.Popen[str], seconds: float = 240) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url, timeout=2)
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {seconds}s")


async def test_gateway_serves_through_the_cli(tmp_path: Path, codec: ChatCodec) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    answer = codec.encode("Hello from the replay.") + codec.eot_ids
    prompt = codec.prompt_ids(messages)
    record = ReplayRecord("r", Generation(answer, [-0.1] * len(answer), "stop"), 0, prompt)
    replay = tmp_path / "replay.jsonl"
    save_records([record], replay)
    port = free_port()
    argv = [*CLI, "gateway", "--model", f"replay:{replay}", "--port", str(port)]
    with process(argv) as proc:
        base = f"http://127.0.0.1:{port}"
        health = wait_http(f"{base}/health", proc)
        assert health.json()["ok"] is True
        session = httpx.post(f"{base}/sessions", json={}, timeout=10).json()
        url = session["base_url"]
        # doctor's endpoint check, against this real OpenAI-compatible server
        from uniagent.models.openai_chat import doctor_check

        [(_, ok, detail)] = await doctor_check(url)
        assert ok, detail
        reply = httpx.post(
            f"{url}/chat/completions", json={"model": "m", "messages": messages}, timeout=60
        ).json()
        assert reply["choices"][0]["message"]["content"] == "Hello from the replay.", reply
        trajectories = httpx.get(f"{base}/sessions/{session['session_id']}/trajectories", timeout=10).json()
        assert trajectories, "the gateway recorded the turn's tokens"


# -- run --backend ray --ray-address --------------------------------------------------------------
@needs_bwrap
def test_run_on_a_ray_cluster_given_by_address(tmp_path: Path, codec: ChatCodec) -> None:
    require_module("ray", "the Ray runner backend (a verl dependency)")
    from run_helpers import write_replay

    [task] = load_tasks("builtin:starter")[:1]
    replay = write_replay(tmp_path / "replay.jsonl", codec, [task])
    port = free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    temp = Path("/tmp") / f"uaray{port}"  # short: Ray's socket paths are limited
    head = [
        str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
        "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}",
    ]  # fmt: skip
    # A cluster with token authentication, as Ray's current default is; the client must say so
    # (Ray never enables it for an explicit address on its own).
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    with process(head, env={**os.environ, **auth}) as proc:
        deadline = time.monotonic() + 180
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stdout.read() if proc.stdout else ""
            )
            time.sleep(0.5)
        out = tmp_path / "run"
        run = subprocess.run(
            [
                *CLI,
                *starter_run(
                    replay, out, "--backend", "ray", "--ray-address", f"127.0.0.1:{port}", "--limit", "1"
                ),
            ],
            capture_output=True,
            text=True,
            timeout=400,
            check=False,
            env={**os.environ, **auth},
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Connecting to existing Ray cluster" in run.stderr, run.stderr[-2000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["episodes"] == 1 and summary["resolved"] == 1
    shutil.rmtree(temp, ignore_errors=True)
