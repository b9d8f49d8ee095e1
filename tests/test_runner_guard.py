"""A run that cannot work says so at once: the preflight before the first episode, and the stop
after the first episodes all fail the same infrastructure way (then `--resume` finishes it).

Real CLI processes, real bubblewrap sandboxes, the real ReplayEngine scripting the model; the
"endpoint" is a real closed port on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import needs_bwrap, require_module
from dashboard_helpers import free_port as closed_port  # free, so nothing listens
from run_helpers import replay_run_args, write_replay
from uniagent.errors import PreflightError
from uniagent.models.factory import ModelFactory
from uniagent.runner import RunStore, build_config
from uniagent.runner.guard import InfraGuard
from uniagent.runner.run import Runner
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

CLI = [sys.executable, "-m", "uniagent.cli"]


def uniagent(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
    )


def test_guard_trips_only_on_a_uniform_start() -> None:
    guard = InfraGuard(3)
    assert [guard.observe("model_error", f"down {i}") for i in range(2)] == [None, None]
    stop = guard.observe("model_error", "chat endpoint X: cannot connect\ntrace")
    assert stop and "first 3 episodes all ended model_error" in stop and "cannot connect" in stop
    assert "trace" not in stop and guard.observe("model_error", "again") is None, "trips once"
    healthy = InfraGuard(2)  # one good episode first: later failures are noise, retried on resume
    assert healthy.observe("finished", None) is None
    assert [healthy.observe("model_error", "x") for _ in range(5)] == [None] * 5
    mixed = InfraGuard(2)  # two kinds of failure: not one broken part
    assert mixed.observe("sandbox_dead", "x") is None and mixed.observe("model_error", "y") is None
    assert mixed.observe("model_error", "y") is None
    off = InfraGuard(0)
    assert all(off.observe("model_error", "x") is None for _ in range(20))


def test_endpoint_check_against_a_closed_port_is_fast_and_names_it() -> None:
    port = closed_port()
    cfg = build_config(None, [f"model.spec=openai:http://127.0.0.1:{port}/v1"])
    factory = ModelFactory(cfg.model)
    import uniagent.models.openai_chat  # noqa: F401 - the SDK's import time is not the check's

    began = time.perf_counter()
    with pytest.raises(Exception) as info:
        asyncio.run(factory.check())
    took = time.perf_counter() - began
    print(json.dumps({"figure": "endpoint_check_closed_port_s", "value": round(took, 3)}))
    assert f"http://127.0.0.1:{port}/v1" in str(info.value) and "cannot connect" in str(info.value)
    assert took < 5, f"the check took {took:.1f}s against a closed port"


@needs_bwrap
def test_run_against_a_closed_port_fails_at_preflight(tmp_path: Path) -> None:
    port = closed_port()
    out = tmp_path / "run"
    began = time.perf_counter()
    proc = uniagent(
        "run", "--model", f"openai:http://127.0.0.1:{port}/v1", "--limit", "3", "--output", str(out)
    )
    took = time.perf_counter() - began
    print(json.dumps({"figure": "cli_preflight_closed_port_s", "value": round(took, 2)}))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith("error: preflight:") and f"http://127.0.0.1:{port}/v1" in lines[0]
    assert RunStore(out / "run.db", readonly=True).count() == 0, "no episode ran"


@needs_bwrap
def test_a_broken_sandbox_backend_fails_at_preflight(tmp_path: Path) -> None:
    """apptainer is not installed here: the container backend cannot start (a missing runtime is
    the realistic broken backend); the run raises before any episode instead of storing N failures."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = build_config(
        None,
        [
            f"model.spec=replay:{empty}",
            "sandbox.type=container",
            "sandbox.runtime=apptainer",
            "sandbox.executable=/nonexistent/apptainer",
            "sandbox.image=docker://python:3.11-slim",
            "tasks.limit=2",
            f"runner.output={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(PreflightError) as info:
        asyncio.run(Runner(cfg).run())
    assert str(info.value).startswith("preflight: the container sandbox could not run `echo`")
    assert "apptainer" in str(info.value)
    assert RunStore(tmp_path / "run" / "run.db", readonly=True).count() == 0


@needs_bwrap
def test_uniform_failures_stop_the_run_and_resume_completes_it(tmp_path: Path, smol_tokenizer) -> None:
    """The model raises for every episode (a replay file with nothing for these tasks, as an
    endpoint that went down after the preflight): the run stops after the threshold with one
    error, keeps what it stored, and `--resume` with a working model stores every pair once."""
    tasks = load_tasks("builtin:starter")[:4]
    ids = ",".join(t.instance_id for t in tasks)
    replay = tmp_path / "replay.jsonl"
    replay.write_text("")
    out = tmp_path / "run"
    args = replay_run_args(replay, out, ids.split(","), sets=["runner.stop_after_infra_failures=2"])
    proc = uniagent(*args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "stopped: the first 2 episodes all ended model_error" in lines[0]
    assert "--resume" in lines[0] and str(out) in lines[0]
    store = RunStore(out / "run.db", readonly=True)
    first = list(store.rows(full=False))
    store.close()
    assert 2 <= len(first) < 4 and {r["exit_reason"] for r in first} == {"model_error"}

    write_replay(replay, ChatCodec(smol_tokenizer), tasks)  # the fix: a model that answers
    again = uniagent(*args, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    store = RunStore(out / "run.db", readonly=True)
    rows = list(store.rows(full=False))
    assert sorted((r["instance_id"], r["sample"]) for r in rows) == sorted((t.instance_id, 0) for t in tasks)
    assert all(r["exit_reason"] == "finished" and r["resolved"] for r in rows)
    failed_first = {r["instance_id"] for r in first}
    assert all(r["attempts"] == (2 if r["instance_id"] in failed_first else 1) for r in rows)


@needs_bwrap
def test_a_ray_address_where_nothing_listens_fails_at_preflight(tmp_path: Path) -> None:
    """`ray.init` against such an address waits for minutes (measured: over 5 minutes here)."""
    require_module("ray", "the Ray runner backend (a verl dependency)")
    port = closed_port()
    proc = uniagent(
        "run", "--backend", "ray", "--ray-address", f"127.0.0.1:{port}", "--limit", "1",
        "--output", str(tmp_path / "run"), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no Ray cluster answers at 127.0.0.1:{port}" in lines[0], proc.stderr[-2000:]


def test_an_image_row_whose_backend_cannot_honour_a_setting_fails_at_start(tmp_path: Path) -> None:
    """`ro_binds` is a bubblewrap setting: a container cannot honour it, so a run whose rows have
    images stops before any episode with the key and the row named (not an internal_error each)."""
    rows = tmp_path / "rows.jsonl"
    row = {
        "family": "swe",
        "instance_id": "img-001",
        "problem_statement": "x",
        "image": "example:1",
        "test_cmd": "true",
    }
    rows.write_text(json.dumps(row) + "\n")
    out = tmp_path / "run"
    proc = uniagent(
        "run", "--tasks", str(rows), "--model", "replay:/nonexistent.jsonl", "--output", str(out),
        "--set", "sandbox.ro_binds=[/opt]",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "img-001" in proc.stderr and "ro_binds" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
