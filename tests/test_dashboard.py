"""The dashboard's JSON API over a real run store (see dashboard_helpers: a real replay run).

In-process requests go through FastAPI's TestClient; the command itself (loopback default,
token when bound elsewhere, clear errors) runs as a real process.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from conftest import needs_bwrap, require_module
from dashboard_helpers import (
    CLI,
    SECRET,
    SECRET_ENV,
    DashboardServer,
    copy_run,
    infra_failure_row,
    replay_run,
    stored_rows,
)
from segment_helpers import segmented_run, two_segment_result
from uniagent.runner import RunStore, summarize
from uniagent.runner.redact import MASK, Redactor
from uniagent.tokens import ChatCodec

fastapi = require_module("fastapi", "the dashboard needs fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from uniagent.dashboard.app import DashboardConfig, create_app, redact_pieces  # noqa: E402

pytestmark = needs_bwrap


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, smol_tokenizer) -> Path:
    return replay_run(tmp_path_factory.mktemp("dash_run"), ChatCodec(smol_tokenizer))


@pytest.fixture(scope="module")
def client(run_dir: Path):
    mp = pytest.MonkeyPatch()
    mp.setenv(SECRET_ENV, SECRET)
    with TestClient(create_app(DashboardConfig([run_dir]))) as c:
        yield c
    mp.undo()


@pytest.fixture(scope="module")
def stored(run_dir: Path) -> dict[tuple[str, int], dict]:
    return stored_rows(run_dir)


def test_runs_summary_matches_the_store(client: TestClient, run_dir: Path) -> None:
    runs = client.get("/api/runs").json()
    assert len(runs) == 1 and runs[0]["name"] == "run" and runs[0]["model"].startswith("replay:")
    s = runs[0]["summary"]
    store = RunStore(run_dir / "run.db", readonly=True)
    truth = summarize(store)
    store.close()
    for key in ("episodes", "resolved", "resolved_rate", "mean_reward", "exit_reasons", "trainable_fraction"):
        assert s[key] == truth[key], key
    assert s["episodes"] == 9 and s["resolved"] == 5
    assert s["exit_reasons"] == {"finished": 7, "max_turns": 1, "sandbox_dead": 1}
    assert s["trainable_fraction"] == pytest.approx(8 / 9, abs=1e-4)
    assert s["tokens_per_s"] and s["tokens_per_s"] > 0
    series = client.get("/api/runs/0/series").json()
    assert [p["i"] for p in series] == list(range(9))
    assert [p["t"] for p in series] == sorted(p["t"] for p in series)


def test_episode_filters_and_sorting(client: TestClient, stored) -> None:
    def get(**params):
        return client.get("/api/runs/0/episodes", params=params).json()

    everything = get()
    assert everything["total"] == everything["count"] == 9
    assert everything["exit_reasons"] == ["finished", "max_turns", "sandbox_dead"]
    assert [e["instance_id"] for e in get(exit_reason="max_turns")["episodes"]] == [
        k[0] for k, r in stored.items() if r["exit_reason"] == "max_turns"
    ]
    assert get(resolved="true")["count"] == 5 and get(resolved="false")["count"] == 4
    untrainable = get(trainable="false")["episodes"]
    assert [(e["instance_id"], e["exit_reason"]) for e in untrainable] == [("infra-001", "sandbox_dead")]
    some_id = next(iter(stored))[0]
    assert {e["instance_id"] for e in get(q=some_id[2:7].upper())["episodes"]} == {some_id}
    by_reward = get(sort="reward", desc="true")["episodes"]
    rewards = [e["reward"] for e in by_reward]
    assert rewards[-1] is None and rewards[:-1] == sorted(rewards[:-1], reverse=True)
    assert [e["turns"] for e in get(sort="turns")["episodes"]] == sorted(r["turns"] for r in stored.values())
    bad = client.get("/api/runs/0/episodes", params={"sort": "messages"})
    assert bad.status_code == 400 and "cannot sort" in bad.json()["detail"]
    assert client.get("/api/runs/3/episodes").status_code == 404


def test_episode_detail_has_conversation_patch_verifier_and_turns(client: TestClient, stored) -> None:
    iid, sample = next(k for k, r in stored.items() if r["resolved"])
    ep = client.get(f"/api/runs/0/episodes/{iid}/{sample}").json()
    assert ep["resolved"] and ep["patch"] and "diff --git" in ep["patch"]
    # SmolLM2's template has no native tools: calls stay in the text; the run's parser reads them.
    assistant = [m for m in ep["messages"] if m["role"] == "assistant"]
    assert [m["content"] for m in assistant] == [
        m["content"] for m in stored[(iid, sample)]["messages"] if m["role"] == "assistant"
    ]
    calls = [c for m in assistant for c in m.get("tool_calls") or m["parsed"]["tool_calls"]]
    assert [c["function"]["name"] for c in calls] == ["bash", "submit"]
    assert "git apply" in json.loads(calls[0]["function"]["arguments"])["command"]
    assert any(m["role"] == "tool" for m in ep["messages"])
    assert isinstance(ep["verifier"], dict) and ep["verifier"] == stored[(iid, sample)]["verifier"]
    (traj,) = stored[(iid, sample)]["segments"]
    assert ep["has_trajectory"] and ep["num_segments"] == 1 and ep["segments"][0]["reason"] == "start"
    assert ep["segments"][0]["model_tokens"] == sum(traj["response_mask"])
    turns = ep["turn_table"]
    assert len(turns) == ep["turns"] == 2
    assert sum(t["model_tokens"] for t in turns) == sum(traj["response_mask"])
    assert sum(t["model_s_est"] for t in turns) == pytest.approx(ep["timings"]["model_s"], rel=1e-3)
    missing = client.get("/api/runs/0/episodes/nope/0")
    assert missing.status_code == 404 and "no episode nope#0" in missing.json()["detail"]


def test_token_view_matches_the_stored_trajectory(client: TestClient, stored, smol_tokenizer) -> None:
    iid, sample = next(k for k, r in stored.items() if r["resolved"])
    (traj,) = stored[(iid, sample)]["segments"]
    data = client.get(f"/api/runs/0/episodes/{iid}/{sample}/tokens").json()
    n_prompt = len(traj["prompt_ids"])
    assert data["prompt_len"] == n_prompt and data["drift"] == traj["drift"]
    toks = data["tokens"]
    assert [t[0] for t in toks] == traj["prompt_ids"] + traj["response_ids"]
    assert [t[2] for t in toks] == [0] * n_prompt + traj["response_mask"]
    assert [t[3] for t in toks[n_prompt:]] == pytest.approx(traj["response_logprobs"], abs=1e-4)
    assert [(s["start"] - n_prompt, s["end"] - n_prompt, s["kind"]) for s in data["spans"]] == [
        (s["start"], s["end"], s["kind"]) for s in traj["spans"]
    ]
    # Per-token text is the run's tokenizer's decode of that one id.
    opts = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    for tid, text, _, _ in toks[:50] + toks[-50:]:
        assert text == smol_tokenizer.decode([tid], **opts)
    infra = client.get("/api/runs/0/episodes/infra-001/0/tokens")
    assert infra.status_code == 404 and "no token trajectory" in infra.json()["detail"]


def test_every_segment_is_shown_and_the_token_view_takes_one_at_a_time(tmp_path: Path, codec) -> None:
    segments = two_segment_result(codec).segments
    with TestClient(create_app(DashboardConfig([segmented_run(tmp_path, codec)]))) as c:
        (light,) = c.get("/api/runs/0/episodes").json()["episodes"]
        assert light["num_segments"] == 2
        ep = c.get("/api/runs/0/episodes/seg-001/0").json()
        assert ep["num_segments"] == 2 and [s["reason"] for s in ep["segments"]] == ["start", "rewritten"]
        assert [s["model_tokens"] for s in ep["segments"]] == [t.num_model_tokens for t in segments]
        assert [s["prompt_tokens"] for s in ep["segments"]] == [len(t.prompt_ids) for t in segments]
        # Turns run on across segments: two in the first, the third in the second.
        assert [(t["turn"], t["segment"]) for t in ep["turn_table"]] == [(0, 0), (1, 0), (2, 1)]
        assert sum(t["model_tokens"] for t in ep["turn_table"]) == sum(t.num_model_tokens for t in segments)
        url = "/api/runs/0/episodes/seg-001/0/tokens"
        first = c.get(url).json()  # the first by default
        chosen = [c.get(url, params={"segment": i}).json() for i in (0, 1)]
        assert first == chosen[0]
        for data, traj in zip(chosen, segments, strict=True):
            assert data["reason"] == traj.reason and data["prompt_len"] == len(traj.prompt_ids)
            assert [t[0] for t in data["tokens"]] == traj.prompt_ids + traj.response_ids
            assert [t[2] for t in data["tokens"]] == [0] * len(traj.prompt_ids) + traj.response_mask
            assert [(s["index"], s["reason"]) for s in data["segments"]] == [(0, "start"), (1, "rewritten")]
        assert [d["segment"] for d in chosen] == [0, 1]
        beyond = c.get(url, params={"segment": 2})
        assert beyond.status_code == 404 and "has 2 segment(s)" in beyond.json()["detail"]


def test_the_token_view_gives_each_tokens_policy_version(tmp_path: Path, codec) -> None:
    segments = two_segment_result(codec, versions=True).segments
    with TestClient(create_app(DashboardConfig([segmented_run(tmp_path / "v", codec, versions=True)]))) as c:
        ep = c.get("/api/runs/0/episodes/seg-001/0").json()
        assert [s["versions"] for s in ep["segments"]] == [[0, 1], [2, 3]]
        url = "/api/runs/0/episodes/seg-001/0/tokens"
        for i, traj in enumerate(segments):
            data = c.get(url, params={"segment": i}).json()
            assert data["versions"] == [-1] * len(traj.prompt_ids) + traj.response_versions
            assert data["version_range"] == list(traj.version_range)
    # An engine that did not say: unknown, not a guess.
    with TestClient(create_app(DashboardConfig([segmented_run(tmp_path / "u", codec)]))) as c:
        data = c.get("/api/runs/0/episodes/seg-001/0/tokens").json()
        assert data["versions"] is None and data["version_range"] is None
        assert c.get("/api/runs/0/episodes/seg-001/0").json()["segments"][0]["versions"] is None


def test_secrets_are_redacted_everywhere(client: TestClient, stored, smol_tokenizer) -> None:
    key = next(k for k, r in stored.items() if r["exit_reason"] == "max_turns")
    assert SECRET in json.dumps(stored[key]["messages"])  # the runner did not know it
    ep = client.get(f"/api/runs/0/episodes/{key[0]}/{key[1]}")
    assert SECRET not in ep.text and MASK in ep.text
    toks = client.get(f"/api/runs/0/episodes/{key[0]}/{key[1]}/tokens")
    assert SECRET[4:12] not in toks.text and MASK in "".join(t[1] for t in toks.json()["tokens"])
    # Nor can the secret be decoded back from token ids: redacted tokens carry no id.
    (traj,) = stored[key]["segments"]
    row_ids = traj["prompt_ids"] + traj["response_ids"]
    hidden = [i for i, t in enumerate(toks.json()["tokens"]) if t[0] is None]
    assert hidden and all(t[0] == row_ids[i] for i, t in enumerate(toks.json()["tokens"]) if t[0] is not None)
    assert SECRET in smol_tokenizer.decode([row_ids[i] for i in hidden]).replace(" ", "")
    assert SECRET not in client.get("/api/runs/0/episodes").text


def test_redact_pieces_masks_a_secret_split_across_tokens() -> None:
    r = Redactor(extra=["hunter2-secret"], env={})
    pieces = ["pass", "=", "hun", "ter2", "-sec", "ret", " ok"]
    assert redact_pieces(pieces, r) == ["pass", "=", MASK, "", "", "", " ok"]
    assert redact_pieces(["a", "b"], Redactor(env={})) == ["a", "b"]


def test_new_episodes_show_up_without_reopening(tmp_path: Path, run_dir: Path) -> None:
    live = copy_run(run_dir, tmp_path / "live")
    with TestClient(create_app(DashboardConfig([run_dir, live]))) as c:
        first = c.get("/api/runs/1/episodes").json()
        assert first["total"] == 9 and [r["name"] for r in c.get("/api/runs").json()] == ["run", "live"]
        writer = RunStore(live / "run.db")
        time.sleep(0.01)
        writer.put(infra_failure_row("infra-002"))
        writer.close()
        new = c.get("/api/runs/1/episodes", params={"since": first["last_finished_at"]}).json()
        assert new["total"] == 10 and [e["instance_id"] for e in new["episodes"]] == ["infra-002"]
        assert c.get("/api/runs/0/episodes").json()["total"] == 9


def test_command_errors_and_token_when_not_on_loopback(run_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "dashboard", str(tmp_path / "nothing")], capture_output=True, text=True)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = subprocess.run([*CLI, "dashboard", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "holds no run.db" in proc.stderr
    with DashboardServer([run_dir], host="0.0.0.0", token="t0ken-for-test") as server:
        assert httpx.get(server.url + "api/runs").status_code == 401
        assert httpx.get(server.url, follow_redirects=False).status_code == 401
        ok = httpx.get(server.url + "api/runs", headers={"Authorization": "Bearer t0ken-for-test"})
        assert ok.status_code == 200 and ok.json()[0]["summary"]["episodes"] == 9
        page = httpx.get(server.url, params={"token": "t0ken-for-test"}, follow_redirects=False)
        assert page.status_code == 303 and "uniagent_dashboard_token" in page.headers["set-cookie"]
        cookies = {"uniagent_dashboard_token": "t0ken-for-test"}
        assert httpx.get(server.url + "api/runs", cookies=cookies).status_code == 200
    with DashboardServer([run_dir], host="0.0.0.0") as server:  # no token given: one is made and printed
        assert httpx.get(server.url + "api/runs").status_code == 401
    printed = server.proc.stdout.read() if server.proc.stdout else ""
    made = printed.split("?token=")[1].split()[0]
    assert len(made) >= 24 and "0.0.0.0" in printed
    with DashboardServer([run_dir]) as server:  # loopback: no token needed
        assert httpx.get(server.url + "api/runs").status_code == 200
        assert "uniagent dashboard" in httpx.get(server.url).text
