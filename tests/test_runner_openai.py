"""`uniagent run --model openai:URL` end to end against a real OpenAI-compatible server: the
project's own gateway on loopback, in both tool formats.

- text: tools are described in the prompt and the model's `<tool_call>` text is parsed by us;
- native: tools travel as the request's `tools`, the gateway parses the model's text and answers
  with OpenAI `tool_calls`, which `OpenAIChatModel` reads (`model.tool_format: native`).

The gateway serves the real ReplayEngine (request-matched, so the scripted turns come back
whatever the prompt renders to; the tokenizer is the real SmolLM2 one): the episode does what
the script says (apply the gold fix, submit), so it must finish resolved. Episodes through an
endpoint are stored not trainable, with the text-only reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import needs_bwrap
from run_helpers import gold_turns
from uniagent.errors import ConfigError
from uniagent.gateway.app import Gateway
from uniagent.gateway.server import GatewayServer
from uniagent.models.base import Generation
from uniagent.models.replay import ReplayEngine, ReplayRecord
from uniagent.runner import RunStore, build_config
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

MODEL = "uniagent-replay"
FORMATS = ("text", "native")


@pytest.fixture(scope="module")
def task():
    return load_tasks("builtin:starter")[0]


@pytest.fixture(scope="module")
def gateway(smol_tokenizer, task) -> Iterator[str]:
    """The gateway serving scripted turns, one session per tool format, in a thread of its own."""
    codec = ChatCodec(smol_tokenizer)
    records = []
    for sid in FORMATS:
        for turn, text in enumerate(gold_turns(task)):
            ids = codec.encode(text) + codec.eot_ids
            records.append(
                ReplayRecord(sid, Generation(ids, [-0.1] * len(ids), "stop"), turn, None, "0" * 64)
            )
    engine = ReplayEngine(records, match="request", strict=False)
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def serve() -> None:
        server = await GatewayServer(Gateway(engine, codec, model_name=MODEL), "127.0.0.1", 0).start()
        box["url"], box["loop"], box["stop"] = server.url, asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        await box["stop"].wait()
        await server.stop()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(60), "the gateway did not start"
    for sid in FORMATS:
        httpx.post(f"{box['url']}/sessions", json={"session_id": sid}, timeout=30).raise_for_status()
    yield box["url"]
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(30)


@needs_bwrap
@pytest.mark.parametrize("tool_format", FORMATS)
def test_run_through_an_openai_endpoint(tmp_path: Path, gateway: str, task, tool_format: str) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "uniagent.cli", "run", "--tasks", "builtin:starter"]
    cmd += ["--model", f"openai:{gateway}/sessions/{tool_format}/v1", "--output", str(out)]
    cmd += ["--max-turns", "5", "--set", f"tasks.ids=[{task.instance_id}]", "--set", f"model.name={MODEL}"]
    cmd += ["--set", f"model.tool_format={tool_format}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]

    rows = list(RunStore(out / "run.db", readonly=True).rows())
    assert len(rows) == 1
    row = rows[0]
    assert row["exit_reason"] == "finished" and row["resolved"] and row["reward"] == 1.0, row["error"]
    assert row["trainable"] is False and row["metrics"]["text_only_model"] is True
    assert row["metrics"]["untrainable_reason"] == "text_only_model"
    assert row["segments"] == [], "an endpoint returns text, never a token record"
    said = [m for m in row["messages"] if m["role"] == "assistant"]
    assert len(said) == 2
    if tool_format == "text":
        assert all("<tool_call>" in m["content"] and not m.get("tool_calls") for m in said)
    else:  # the endpoint's own tool_calls, kept as returned
        assert [m["tool_calls"][0]["function"]["name"] for m in said] == ["bash", "submit"]
        assert all("<tool_call>" not in (m["content"] or "") for m in said)
        tool_msgs = [m for m in row["messages"] if m["role"] == "tool"]
        assert tool_msgs and tool_msgs[0]["tool_call_id"] == said[0]["tool_calls"][0]["id"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resolved"] == 1 and summary["trainable_fraction"] == 0.0

    # The server side agrees: one append-only chain (each request extended the last), token-exact.
    trajs = httpx.get(f"{gateway}/sessions/{tool_format}/trajectories", timeout=30).json()
    assert len(trajs) == 1 and trajs[0]["drift"] is None


def test_tool_format_is_validated() -> None:
    assert build_config(None, ["model.spec=openai:http://h/v1", "model.tool_format=native"]).model.tool_format
    with pytest.raises(ConfigError, match="tool_format native needs an openai:URL model"):
        build_config(None, ["model.spec=local", "model.tool_format=native"])
    with pytest.raises(ConfigError, match=r"model\.tool_format"):
        build_config(None, ["model.tool_format=json"])
