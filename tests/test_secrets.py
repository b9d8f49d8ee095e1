"""No secret is recoverable from any byte uniagent writes, token ids included.

A secret in the environment (an API key) that the model echoes, and that a tool prints back,
is looked for in every file of a real `uniagent run` directory (run.db bytes, exports, config),
in the decode of every stored id sequence with the real SmolLM2 tokenizer, in the run's output,
in the dashboard's API (started without knowing the secret: the store itself must be clean) and
in a real gateway's trajectories. Episodes whose tokens had to change are not trainable.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import real_tokenizers as real
from agent_helpers import call
from conftest import needs_bwrap
from uniagent.redact import MASK, REDACTED_ROLE, UNTRAINABLE_REASON, Redactor, redact_logs
from uniagent.tokens import ChatCodec, Trajectory

SECRET = "sk-test-4f9c2a7e1b3d58c6a0e2"
SECRET_ENV = "OPENAI_API_KEY"
CLI = [sys.executable, "-m", "uniagent.cli"]


def decodes(tokenizer: Any, traj: dict[str, Any]) -> list[str]:
    """Every way to read text back from a stored trajectory's ids."""
    prompt, response = traj["prompt_ids"], traj["response_ids"]
    seqs = [prompt, response, prompt + response]
    seqs += [response[s["start"] : s["end"]] for s in traj["spans"]]
    out = []
    for ids in seqs:
        for skip in (False, True):
            out.append(tokenizer.decode(ids, skip_special_tokens=skip))
    out.append("".join(tokenizer.decode([i]) for i in prompt + response))
    return out


def assert_consistent(traj: dict[str, Any]) -> None:
    """The Trajectory invariants: equal lengths, mask 1 only in model spans, logprob 0 on context."""
    Trajectory.from_dict(traj).validate()
    n = len(traj["response_ids"])
    assert len(traj["response_mask"]) == len(traj["response_logprobs"]) == n


# -- the redactor on a trajectory ------------------------------------------------------------


@pytest.fixture(scope="module", params=["smollm2", *real.OWN_PAIRS])
def pair_codec(request, codec):  # type: ignore[no-untyped-def]
    """SmolLM2's codec and each real tokenizer with its own template: their merges cut a secret
    into different tokens."""
    return real.codec_or_smol(request, codec)


def tool_role(codec: ChatCodec) -> str:
    """Tool results as user turns where the template raises on the tool role (Gemma, gpt-oss's
    tool result needs the assistant's tool call before it)."""
    return "tool" if codec.renders_tool_role else "user"


def test_secret_tokens_are_replaced_even_across_token_and_span_boundaries(pair_codec: ChatCodec) -> None:
    codec = pair_codec
    other = "hunter2-correct-horse"
    r = Redactor(extra=[SECRET, other], env={})
    traj = Trajectory(codec.prompt_ids([{"role": "user", "content": f"my password is {other}, keep it"}]))
    say = codec.encode(f"The key is {SECRET}, done.") + codec.eot_ids
    traj.add_generation(say, [-0.25] * len(say))
    role = tool_role(codec)
    traj.add_context(codec.continuation_ids([{"role": role, "content": f"echo: {SECRET}"}]), role=role)
    # The model starts the secret and the next context finishes it: one secret over two spans.
    head = codec.encode(f"again {SECRET[:9]}")
    traj.add_generation(head, [-0.5] * len(head), "length")
    traj.add_context(codec.encode(SECRET[9:] + " ok"), role="user")
    traj.drift = len(traj) - 1
    traj.validate()
    before = traj.to_dict()
    assert any(SECRET in t or other in t for t in decodes(codec.tokenizer, before))

    clean = r.trajectory(before, codec)
    assert clean is not None and clean["secret_redacted"] is True
    assert_consistent(clean)
    for text in decodes(codec.tokenizer, clean):
        assert SECRET not in text and other not in text
        assert SECRET[:9] not in text and SECRET[9:] not in text
    full = codec.decode(clean["prompt_ids"] + clean["response_ids"])
    assert full.count(MASK) == 4 and "my password is [REDACTED], keep it" in full
    assert "The key is [REDACTED], done." in full, "text around the secret is kept"
    # Replacement tokens are context (not what the policy produced); the rest keeps its record.
    spans = clean["spans"]
    redacted = [s for s in spans if s["role"] == REDACTED_ROLE]
    assert len(redacted) == 3 and all(s["kind"] == "context" for s in redacted)
    for s in redacted:
        assert set(clean["response_mask"][s["start"] : s["end"]]) == {0}
        assert set(clean["response_logprobs"][s["start"] : s["end"]]) == {0.0}
    model = [s for s in spans if s["kind"] == "model"]
    assert {s["turn"] for s in model} == {0, 1} and len(model) == 3, "turn 0 cut in two by the secret"
    assert clean["num_turns"] == 2 and clean["finish_reasons"] == ["stop", "length"]
    lp = [x for s in model for x in clean["response_logprobs"][s["start"] : s["end"]]]
    assert set(lp) <= {-0.25, -0.5}
    assert clean["drift"] == len(clean["prompt_ids"]) + len(clean["response_ids"]) - 1, "drift moved along"

    # Nothing to hide: the very same dict; no known secret: nothing to do.
    plain = Trajectory(codec.prompt_ids([{"role": "user", "content": "hello"}])).to_dict()
    assert r.trajectory(plain, codec) is plain
    assert Redactor(env={}).trajectory(before, codec) is before


def test_result_marks_the_episode_untrainable_only_when_tokens_changed(pair_codec: ChatCodec) -> None:
    codec = pair_codec
    r = Redactor(extra=[SECRET], env={}, tokenizer=lambda: codec.tokenizer)
    traj = Trajectory(codec.prompt_ids([{"role": "user", "content": "go"}]))
    ids = codec.encode(f"key={SECRET}") + codec.eot_ids
    traj.add_generation(ids, [-0.1] * len(ids))
    result = {"exit_reason": "finished", "trainable": True, "metrics": {"turns": 1}, "error": SECRET}
    out = r.result({**result, "trajectory": traj.to_dict()})
    assert out["trainable"] is False and out["metrics"]["untrainable_reason"] == UNTRAINABLE_REASON
    assert out["error"] == MASK and SECRET not in json.dumps(out)
    # A secret only in text (an error message) leaves the token record exact and trainable.
    clean = Trajectory(codec.prompt_ids([{"role": "user", "content": "go"}])).to_dict()
    out = r.result({**result, "trajectory": clean})
    assert out["trainable"] is True and "untrainable_reason" not in out["metrics"]
    assert out["trajectory"] == clean and out["error"] == MASK


def test_redaction_keeps_policy_versions_aligned(pair_codec: ChatCodec) -> None:
    """A model token that becomes a redaction marker is context (version -1); the rest keep theirs."""
    codec = pair_codec
    r = Redactor(extra=[SECRET], env={})
    traj = Trajectory(codec.prompt_ids([{"role": "user", "content": "go"}]))
    say = codec.encode(f"The key is {SECRET}, done.") + codec.eot_ids
    half = len(say) // 2  # a weight update landed mid-turn
    traj.add_generation(say, [-0.25] * len(say), versions=[2] * half + [3] * (len(say) - half))
    role = tool_role(codec)
    traj.add_context(codec.continuation_ids([{"role": role, "content": "ok"}]), role=role)
    clean = r.trajectory(traj.to_dict(), codec)
    assert clean is not None and clean["secret_redacted"] is True
    again = Trajectory.from_dict(clean)  # validates: versions aligned, -1 exactly on context
    assert len(again.response_versions) == len(again.response_ids)
    assert again.version_range == (2, 3)
    redacted = [s for s in again.spans if s.role == REDACTED_ROLE]
    assert redacted and all(set(again.response_versions[s.start : s.end]) == {-1} for s in redacted)


def test_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    redact_logs(Redactor(extra=["log-secret-123456"], env={}))
    log = logging.getLogger("uniagent.test_secrets")
    with caplog.at_level(logging.INFO):
        log.warning("the endpoint said %s", "bad key log-secret-123456")
        try:
            raise RuntimeError("boom log-secret-123456")
        except RuntimeError:
            log.exception("failed")
    assert "log-secret-123456" not in caplog.text and MASK in caplog.text


# -- a real run, its store, exports, output and dashboard -----------------------------------


@needs_bwrap
def test_a_run_keeps_no_secret_in_any_byte(tmp_path: Path, codec: ChatCodec) -> None:
    from uniagent.models.base import Generation
    from uniagent.models.replay import ReplayRecord
    from uniagent.runner import RunStore
    from uniagent.tasks import load_tasks

    task = load_tasks("builtin:starter")[0]
    turns = [call("bash", command=f"echo token={SECRET} && ls"), call("submit")]
    lines = []
    for turn, text in enumerate(turns):
        ids = codec.encode(text) + codec.eot_ids
        generation = Generation(ids, [-0.2] * len(ids), "stop")
        rec = ReplayRecord(f"{task.instance_id}#0", generation, turn, None, "0" * 64)
        lines.append(json.dumps(rec.to_json()))
    replay = tmp_path / "replay.jsonl"
    replay.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    args = ["run", "--tasks", "builtin:starter", "--model", f"replay:{replay}", "--max-turns", "3"]
    args += ["--output", str(out), "--set", f"tasks.ids=[{task.instance_id}]"]
    proc = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=600, env={**os.environ, SECRET_ENV: SECRET}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr

    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"run.db", "results.jsonl", "summary.json", "config.yaml"} <= {p.name for p in files}
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path.name

    store = RunStore(out / "run.db", readonly=True)
    (row,) = list(store.rows())
    store.close()
    exported = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert MASK in json.dumps(row["messages"]), "the model did echo the secret"
    for traj in (*row["segments"], *exported[0]["segments"]):
        assert_consistent(traj)
        for text in decodes(codec.tokenizer, traj):
            assert SECRET not in text
        assert MASK in codec.decode(traj["response_ids"])
    # Its tokens were changed: not what the policy produced, so not trainable, and it says why.
    assert row["exit_reason"] == "finished" and row["trainable"] is False
    assert row["metrics"]["untrainable_reason"] == UNTRAINABLE_REASON

    # The dashboard, started without the secret in its environment, has nothing to hide.
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from uniagent.dashboard.app import DashboardConfig, create_app

    mp = pytest.MonkeyPatch()
    mp.delenv(SECRET_ENV, raising=False)
    try:
        with TestClient(create_app(DashboardConfig([out]))) as client:
            base = f"/api/runs/0/episodes/{task.instance_id}/0"
            for url in ("/api/runs", "/api/runs/0", "/api/runs/0/episodes", "/api/runs/0/series", base):
                r = client.get(url)
                assert r.status_code == 200 and SECRET not in r.text, url
            toks = client.get(base + "/tokens").json()["tokens"]
            assert all(t[0] is not None for t in toks), "no ids to hide: the store holds none"
            assert SECRET not in codec.decode([t[0] for t in toks])
            assert SECRET not in "".join(t[1] for t in toks)
    finally:
        mp.undo()


# -- the gateway's trajectories ------------------------------------------------------------


async def test_gateway_trajectories_hold_no_secret(codec: ChatCodec, monkeypatch: pytest.MonkeyPatch) -> None:
    from uniagent.gateway import Gateway
    from uniagent.gateway.server import GatewayServer
    from uniagent.models.base import Generation
    from uniagent.models.replay import ReplayEngine, ReplayRecord

    monkeypatch.setenv(SECRET_ENV, SECRET)
    answers = [f"Your key is {SECRET}.", "ok"]
    records = []
    for i, text in enumerate(answers):
        ids = codec.encode(text) + codec.eot_ids
        records.append(ReplayRecord("s1", Generation(ids, [-0.5] * len(ids), "stop"), i, None, "0" * 64))
    engine = ReplayEngine(records, match="request", strict=False)
    async with (
        GatewayServer(Gateway(engine, codec)) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        r = await http.post("/sessions", json={"session_id": "s1"})
        assert r.status_code == 201, r.text
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Remember {SECRET} please."}]
        for _ in answers:
            r = await http.post("/sessions/s1/v1/chat/completions", json={"messages": messages})
            assert r.status_code == 200, r.text
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "again"}]
        got = await http.get("/sessions/s1/trajectories")
        done = await http.post("/sessions/s1/finalize", json={"reward": 1.0})
    for response in (got, done):
        assert response.status_code == 200 and SECRET not in response.text
    (traj,) = got.json()
    for text in decodes(codec.tokenizer, traj):
        assert SECRET not in text
    assert traj["secret_redacted"] is True and traj["num_turns"] == 2
    assert_consistent(traj)
    assert codec.decode(traj["prompt_ids"]).count(MASK) == 1


# -- verl's parquet files ------------------------------------------------------------------


def test_verl_data_refuses_a_task_that_holds_a_secret(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("pyarrow")
    from uniagent.errors import ConfigError
    from uniagent.integrations.verl.data import prepare
    from uniagent.tasks import load_tasks

    task = load_tasks("builtin:starter")[0]
    leaked = task.messages()[-1]["content"][:24]  # as if a key had been pasted into the task file
    monkeypatch.setenv("UNIAGENT_TEST_DATA_TOKEN", leaked)
    with pytest.raises(ConfigError, match=f"task {task.instance_id} .* holds a secret"):
        prepare("builtin:starter", tmp_path / "a", val_size=2)
    assert not (tmp_path / "a" / "train.parquet").exists()
    monkeypatch.delenv("UNIAGENT_TEST_DATA_TOKEN")
    assert prepare("builtin:starter", tmp_path / "b", val_size=2)["n_train"] > 0


def test_locations_are_not_secrets(tmp_path: Path) -> None:
    """XAUTHORITY, SSH_AUTH_SOCK and friends name where something is: masking them would make
    every episode that prints a path untrainable for nothing."""
    existing = tmp_path / "creds.json"
    existing.write_text("{}")
    env = {
        "XAUTHORITY": "/home/someone/.Xauthority",
        "SSH_AUTH_SOCK": "/tmp/ssh-abcdef/agent.1234",
        "GOOGLE_APPLICATION_CREDENTIALS": str(existing),
        "OPENAI_API_KEY": "sk-live-0123456789abcdef",
    }
    r = Redactor(env=env)
    assert r.values == ["sk-live-0123456789abcdef"]
    assert (
        r.text("cat /home/someone/.Xauthority sk-live-0123456789abcdef")
        == f"cat /home/someone/.Xauthority {MASK}"
    )
