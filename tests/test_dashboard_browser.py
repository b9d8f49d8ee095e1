"""The dashboard in a real browser: headless Debian Chromium driven by Playwright.

The server is the real `uniagent dashboard` process over a real replay run (dashboard_helpers).
Screenshots land in artifacts/ (git-ignored): dashboard_runs.png, dashboard_episodes.png,
dashboard_episode.png, dashboard_tokens.png, dashboard_segments.png and dashboard_versions.png.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from conftest import needs, needs_bwrap, require_module
from dashboard_helpers import DashboardServer, copy_run, replay_run, stored_rows
from segment_helpers import segmented_run
from uniagent.runner import RunStore
from uniagent.tokens import ChatCodec

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    needs("Chromium", CHROMIUM.exists(), "apt-get install chromium (Debian's, at /usr/bin/chromium)"),
    needs_bwrap,  # makes the run
]
sync_api = require_module("playwright.sync_api", "playwright drives the browser (pip install -e .[dev])")
require_module("fastapi", "the dashboard needs fastapi")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, smol_tokenizer) -> Path:
    return replay_run(tmp_path_factory.mktemp("dash_run"), ChatCodec(smol_tokenizer))


@pytest.fixture(scope="module")
def live_dir(tmp_path_factory, run_dir: Path) -> Path:
    return copy_run(run_dir, tmp_path_factory.mktemp("dash_live") / "live")


@pytest.fixture(scope="module")
def segmented_dir(tmp_path_factory, codec: ChatCodec) -> Path:
    """Two segments whose tokens carry policy versions (an async trainer's episode)."""
    return segmented_run(tmp_path_factory.mktemp("dash_segments"), codec, versions=True)


@pytest.fixture(scope="module")
def server(run_dir: Path, live_dir: Path, segmented_dir: Path):
    with DashboardServer([run_dir, live_dir, segmented_dir]) as s:
        yield s


@pytest.fixture(scope="module")
def browser_context():
    profile = tempfile.mkdtemp(prefix="ua-chromium-")
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            args=ARGS,
            headless=True,
            viewport={"width": 1400, "height": 900},
        )
        yield ctx
        ctx.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser_context):
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    page.close()
    assert not errors, f"JavaScript errors: {errors}"


@pytest.fixture(scope="module")
def stored(run_dir: Path) -> dict[tuple[str, int], dict]:
    return stored_rows(run_dir)


def rows_shown(page) -> list[str]:
    return page.eval_on_selector_all("#episodes tbody tr", "trs => trs.map(t => t.dataset.key)")


def wait_rows(page, n: int) -> list[str]:
    page.wait_for_function(f"document.querySelectorAll('#episodes tbody tr').length === {n}", timeout=10_000)
    return rows_shown(page)


def test_runs_page_shows_the_summary_and_the_reward_chart(page, server) -> None:
    page.goto(server.url)
    card = page.locator(".card.run[data-run='0']")
    card.wait_for()
    assert card.locator(".n-episodes").inner_text() == "9"
    assert card.locator(".resolved-rate .v").inner_text() == "55.6%"
    assert card.locator(".trainable .v").inner_text() == "88.9%"
    legend = card.locator(".exit-legend").inner_text()
    assert "finished 7" in legend and "max_turns 1" in legend and "sandbox_dead 1" in legend
    assert card.locator("svg.reward-chart circle").count() == 8  # the infra failure has no reward
    assert page.locator(".card.run").count() == 3
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_runs.png"), full_page=True)


def test_filter_open_an_episode_and_its_tokens(page, server, stored) -> None:
    page.goto(server.url + "#/run/0")
    assert len(wait_rows(page, 9)) == 9
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_episodes.png"), full_page=True)
    page.select_option("#f-resolved", "false")
    assert sorted(wait_rows(page, 4)) == sorted(
        f"{i}#{s}" for (i, s), r in stored.items() if not r["resolved"]
    )
    page.select_option("#f-exit", "max_turns")
    (only,) = wait_rows(page, 1)
    only_id, only_sample = only.split("#")
    assert stored[(only_id, int(only_sample))]["exit_reason"] == "max_turns"
    page.select_option("#f-exit", "")
    page.select_option("#f-resolved", "true")
    page.select_option("#f-trainable", "true")
    resolved = wait_rows(page, 5)
    iid, sample = next(k for k, r in stored.items() if r["resolved"])
    page.fill("#f-q", iid)
    want = [f"{i}#{s}" for (i, s), r in stored.items() if i == iid and r["resolved"]]
    assert sorted(wait_rows(page, len(want))) == sorted(want) and set(want) <= set(resolved)
    page.click("#episodes th[data-sort='sample']")
    page.click("#episodes th[data-sort='sample']")  # descending
    page.wait_for_selector("#episodes th.sorted.desc[data-sort='sample']")
    assert "desc=1" in page.url and f"q={iid}" in page.url

    page.click(f"#episodes tr[data-key='{iid}#{sample}'] a")
    page.wait_for_selector("#conversation .msg")
    row = stored[(iid, sample)]
    assert page.locator("#conversation .msg").count() == len(row["messages"])
    assert page.locator("#conversation .call .name").all_inner_texts()[:2] == ["→ bash", "→ submit"]
    assert "diff --git" in page.locator("#patch").inner_text()
    assert page.locator("#patch .add").count() > 0
    assert "tests_ran" in page.locator("#verifier").inner_text()
    assert page.locator("#turns tr").count() == 1 + row["turns"]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_episode.png"), full_page=True)

    page.click("#token-link")
    page.wait_for_selector("#tokens .t")
    (traj,) = row["segments"]
    n_prompt = len(traj["prompt_ids"])
    masks = page.eval_on_selector_all("#tokens .t", "ts => ts.map(t => +t.dataset.m)")
    assert masks == [0] * n_prompt + traj["response_mask"]
    segs = page.eval_on_selector_all(
        "#tokens .seg", "ss => ss.map(s => [s.dataset.kind, +s.dataset.start, +s.dataset.end])"
    )
    assert segs[0] == ["prompt", 0, n_prompt]
    assert segs[1:] == [[s["kind"], s["start"] + n_prompt, s["end"] + n_prompt] for s in traj["spans"]]
    # Every token inside a model segment is a mask-1 token and vice versa.
    model_in_dom = page.eval_on_selector_all("#tokens .seg.model .t", "ts => ts.map(t => +t.dataset.i)")
    assert model_in_dom == [n_prompt + i for i, m in enumerate(traj["response_mask"]) if m]
    first_model = model_in_dom[0]
    page.hover(f"#tokens .t[data-i='{first_model}']")
    tip = page.locator("#tip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    token_id = traj["response_ids"][first_model - n_prompt]
    logprob = traj["response_logprobs"][first_model - n_prompt]
    assert f"id {token_id}" in text and "model (mask 1)" in text and f"logprob {logprob:.4f}" in text
    assert page.locator("#drift-marker").count() == (0 if traj["drift"] is None else 1)
    page.screenshot(path=str(ARTIFACTS / "dashboard_tokens.png"), full_page=False)


def test_a_new_episode_appears_while_the_page_is_open(page, server, live_dir: Path, stored) -> None:
    page.goto(server.url + "#/run/1")
    assert len(wait_rows(page, 9)) == 9
    page.evaluate("window.__not_reloaded = true")
    # A copy of a resolved episode, stored now, with drift detected 5 tokens into the response.
    src = next(r for r in stored.values() if r["resolved"])
    row = {k: v for k, v in src.items() if k != "attempts"}
    n_prompt = len(row["segments"][0]["prompt_ids"])
    row.update(instance_id="live-added-001", sample=0, finished_at=time.time(), drift=n_prompt + 5)
    row["segments"] = [{**row["segments"][0], "drift": n_prompt + 5}]
    writer = RunStore(live_dir / "run.db")
    writer.put(row)
    writer.close()
    page.wait_for_selector("#episodes tr[data-key='live-added-001#0']", timeout=15_000)
    assert page.evaluate("window.__not_reloaded") is True
    assert "new" in page.get_attribute("#episodes tr[data-key='live-added-001#0']", "class")
    assert page.locator("#ep-count").inner_text().endswith("of 10 episodes")

    page.click("#episodes tr[data-key='live-added-001#0'] a")
    page.click("#token-link")
    page.wait_for_selector("#drift-marker")
    after = page.eval_on_selector("#drift-marker", "m => +m.nextElementSibling.dataset.i")
    assert after == n_prompt + 5
    assert "drift" in page.get_attribute(f"#tokens .t[data-i='{n_prompt + 5}']", "class")


def test_the_segment_switcher_shows_one_segment_at_a_time(page, server, segmented_dir: Path) -> None:
    store = RunStore(segmented_dir / "run.db", readonly=True)
    (row,) = list(store.rows())
    store.close()
    first, second = row["segments"]
    page.goto(server.url + "#/run/2/ep/seg-001/0")
    assert page.locator("#segment-reasons").inner_text() == "2 segments: start, rewritten"
    page.click("#token-link")
    page.wait_for_selector("#segment-switch a.current[data-segment='0']")
    assert page.locator("#tokens .t").count() == len(first["prompt_ids"]) + len(first["response_ids"])
    page.click("#segment-switch a[data-segment='1']")
    page.wait_for_selector("#segment-switch a.current[data-segment='1']")
    assert "segment=1" in page.url and page.locator("#segment-shown").inner_text() == "1"
    ids = page.eval_on_selector_all("#tokens .t", "ts => ts.length")
    assert ids == len(second["prompt_ids"]) + len(second["response_ids"])
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_segments.png"), full_page=False)


def test_the_token_view_shows_policy_versions_and_their_changes(page, server, segmented_dir: Path) -> None:
    """An async trainer's episode: each model token's version on hover, a band per version and a
    marker where the version changes (between turns, and inside the partial-rollout turn)."""
    store = RunStore(segmented_dir / "run.db", readonly=True)
    (row,) = list(store.rows())
    store.close()
    first, second = row["segments"]
    page.goto(server.url + "#/run/2/ep/seg-001/0")
    page.click("#token-link")
    page.wait_for_selector("#tokens .t")
    assert page.locator("#version-range").inner_text() == "v0–v1"
    assert page.locator("#version-legend").inner_text() == "policy versions v0 → v1"
    n = len(first["prompt_ids"])
    shown = page.eval_on_selector_all("#tokens .t[data-v]", "ts => ts.map(t => [+t.dataset.i, +t.dataset.v])")
    tags = zip(first["response_versions"], first["response_mask"], strict=True)
    assert shown == [[n + i, v] for i, (v, m) in enumerate(tags) if m]
    markers = page.eval_on_selector_all(
        "#tokens .version-marker", "ms => ms.map(m => [m.innerText, +m.nextElementSibling.dataset.i])"
    )
    turn2 = next(s for s in first["spans"] if s["kind"] == "model" and s["turn"] == 1)
    assert markers == [["v0 → v1", n + turn2["start"]]]
    banded = "ts => ts.map(t => t.classList.contains('vband-' + (t.dataset.v % 2)))"
    assert set(page.eval_on_selector_all("#tokens .t[data-v]", banded)) == {True}
    page.hover(f"#tokens .t[data-i='{n + turn2['start']}']")
    page.locator("#tip").wait_for(state="visible")
    assert "policy version v1" in page.locator("#tip").inner_text()
    # The second segment: its one turn was interrupted by a weight update halfway (v2 then v3).
    page.click("#segment-switch a[data-segment='1']")
    page.wait_for_selector("#segment-switch a.current[data-segment='1']")
    page.wait_for_selector("#tokens .version-marker")
    versions = second["response_versions"]
    cut = len(second["prompt_ids"]) + versions.index(3)
    assert page.eval_on_selector_all(
        "#tokens .version-marker", "ms => ms.map(m => [m.innerText, +m.nextElementSibling.dataset.i])"
    ) == [["v2 → v3", cut]]
    assert page.locator("#version-legend").inner_text() == "policy versions v2 → v3"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_versions.png"), full_page=False)
