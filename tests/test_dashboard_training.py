"""The dashboard's training runs: the /api/train endpoints over crafted trainer outputs (a sync run
and an async run, the rows as `uniagent train --engine local` writes them), the command's
`--train`, and the page in a real browser with both runs overlaid on one chart.

The metrics files are written here rather than by a real training run: the page reads files, and
a real run of the shape needed (an async run with staleness, interrupted generations, dropped
groups) takes many minutes on this CPU. Every key the trainer logs today is in the rows, with the
new async keys only in the async run, as a sync run writes them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import needs, require_module
from dashboard_helpers import CLI, DashboardServer
from test_dashboard_browser import ARTIFACTS, CHROMIUM, browser_context, page  # noqa: F401 - fixtures

fastapi = require_module("fastapi", "the dashboard needs fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from uniagent.dashboard.app import DashboardConfig, create_app  # noqa: E402
from uniagent.dashboard.training import read_metrics_live  # noqa: E402

STEPS = 6
GAP = 3
"""The sync run's step with no trainable episode (reward null, no loss keys), as the trainer logs it."""


def base_row(step: int, reward: float) -> dict[str, Any]:
    """The keys every local run logs (train/local.py), with plausible values."""
    return {
        "step": step,
        "reward_mean": reward,
        "resolved_rate": reward,
        "episodes": 8,
        "untrainable": 0,
        "episodes_trained": 8.0,
        "loss": 0.3 - 0.02 * step,
        "pg_loss": 0.3 - 0.02 * step,
        "pg_clipfrac": 0.01 * step,
        "ppo_kl": 0.001 * step,
        "grad_norm": 0.5,
        "train_tokens": 900.0,
        "rollout_corr/kl": 0.0005 * step,
        "rollout_corr/rollout_is_mean": 1.0,
        "training/rollout_logprob_diff_mean": 0.002,
        "rollout_tokens_per_s": 40.0,
        "train_tokens_per_s": 300.0,
        "rollout_s": 20.0,
        "update_s": 3.0,
        "step_s": 23.0,
        "rss_mb": 4000.0,
        "exit_reasons": {"finished": 8},
        "time": 1_800_000_000.0 + 23 * step,
    }


def sync_row(step: int) -> dict[str, Any]:
    row = base_row(step, 0.1 + 0.05 * step)
    if step == GAP:  # every episode failed for infrastructure reasons: no reward, no update
        row = {k: v for k, v in row.items() if not k.startswith(("loss", "pg_", "ppo_", "rollout_corr"))}
        row.update(reward_mean=None, resolved_rate=None, untrainable=8, episodes_trained=0.0)
    return row


def async_row(step: int) -> dict[str, Any]:
    row = base_row(step, 0.1 + 0.06 * step)
    row.update(
        step_s=14.0,
        loss=0.25 - 0.015 * step,
        rollout_tokens_per_s=65.0,
        mode="async",
        policy_version=step,
        staleness_hist={"0": 5, "1": 3} if step > 1 else {"0": 8},
        staleness_max=1 if step > 1 else 0,
        trainer_idle_frac=0.1,
        engine_idle_frac=0.05,
        interrupted=2,
        groups_dropped_zero_variance=1,
        episodes_stale_dropped=0,
        episodes_no_gradient=1,
    )
    return row


def write_rows(path: Path, rows: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


@pytest.fixture
def train_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A sync run (no async keys at all) and an async run whose last line is half-written."""
    sync, async_ = tmp_path / "train_sync", tmp_path / "train_async"
    for d in (sync, async_):
        (d / "checkpoints").mkdir(parents=True)
    write_rows(sync / "metrics.jsonl", [sync_row(s) for s in range(1, STEPS + 1)])
    (sync / "checkpoints" / "step_000006.pt").write_bytes(b"")
    (sync / "reward_curve.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    half = json.dumps(async_row(STEPS + 1))[:40]
    write_rows(async_ / "metrics.jsonl", [async_row(s) for s in range(1, STEPS + 1)], tail=half)
    return sync, async_


def client_for(dirs: list[Path], token: str | None = None) -> TestClient:
    return TestClient(create_app(DashboardConfig([], token=token, train_dirs=dirs)))


def test_api_summarises_a_sync_and_an_async_run(train_dirs: tuple[Path, Path]) -> None:
    sync, async_ = train_dirs
    with client_for([sync, async_]) as c:
        listed = c.get("/api/train").json()
        assert [r["name"] for r in listed] == ["train_sync", "train_async"]
        s, a = (c.get(f"/api/train/{i}").json() for i in (0, 1))
    assert [r["step"] for r in s["rows"]] == list(range(1, STEPS + 1))
    assert [r["step"] for r in a["rows"]] == list(range(1, STEPS + 1))  # the half-written row is not one
    assert a["skipped_lines"] == 0 and a["rows"][-1] == async_row(STEPS)
    assert listed[1]["summary"] == a["summary"]
    # The async run: every new key, summed or averaged over the run.
    sa = a["summary"]
    assert sa["mode"] == "async" and sa["policy_version"] == STEPS and sa["staleness_max"] == 1
    assert sa["staleness_hist"] == {"0": 8 + 5 * (STEPS - 1), "1": 3 * (STEPS - 1)}
    assert sa["interrupted"] == 2 * STEPS and sa["groups_dropped_zero_variance"] == STEPS
    assert sa["episodes_stale_dropped"] == 0 and sa["episodes_no_gradient"] == STEPS
    assert sa["trainer_idle_frac_mean"] == pytest.approx(0.1) and sa["step_s_mean"] == pytest.approx(14.0)
    assert sa["reward_last"] == pytest.approx(sum(0.1 + 0.06 * k for k in range(2, 7)) / 5)
    assert sa["wall_s"] == pytest.approx(14.0 * STEPS)
    # The sync run logs none of them: None, not an error, not a zero.
    ss = s["summary"]
    for key in (
        "mode",
        "policy_version",
        "staleness_hist",
        "staleness_max",
        "interrupted",
        "trainer_idle_frac_mean",
    ):
        assert ss[key] is None, key
    assert ss["steps"] == STEPS and ss["rollout_tokens_per_s_mean"] == pytest.approx(40.0)
    assert ss["reward_first"] == pytest.approx(sum(0.1 + 0.05 * k for k in (1, 2, 4, 5, 6)) / 5)
    assert ss["untrainable"] == 8 and s["rows"][GAP - 1]["reward_mean"] is None
    assert s["checkpoints"] == ["step_000006.pt"] and s["has_curve"] and not a["has_curve"]
    assert s["rows"][0]["exit_reasons"] == {"finished": 8}  # every key passed on as logged


def test_a_growing_metrics_file_is_read_fresh(train_dirs: tuple[Path, Path]) -> None:
    _, async_ = train_dirs
    path = async_ / "metrics.jsonl"
    with client_for([async_]) as c:
        assert c.get("/api/train/0").json()["summary"]["steps"] == STEPS
        rest = json.dumps(async_row(STEPS + 1))[40:]
        append(path, rest + "\n")  # the half-written row completes
        data = c.get("/api/train/0").json()
        assert data["summary"]["steps"] == STEPS + 1 and data["summary"]["policy_version"] == STEPS + 1
        append(path, "{not json\n" + json.dumps(async_row(STEPS + 2))[:10])
        data = c.get("/api/train/0").json()
        assert data["summary"]["steps"] == STEPS + 1 and data["skipped_lines"] == 1
        # A resume from an earlier checkpoint rewrites the file shorter: the page follows.
        write_rows(path, [async_row(s) for s in range(1, 4)])
        assert [r["step"] for r in c.get("/api/train/0").json()["rows"]] == [1, 2, 3]
        path.unlink()
        empty = c.get("/api/train/0").json()
        assert empty["rows"] == [] and empty["summary"]["steps"] == 0 and empty["summary"]["mode"] is None
        assert c.get("/api/train/1").status_code == 404
        assert c.get("/api/train/0/reward_curve.png").status_code == 404


def test_read_metrics_live_keeps_the_last_row_of_a_repeated_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write_rows(path, [sync_row(1), sync_row(2), {**sync_row(2), "reward_mean": 0.9}, sync_row(3)])
    rows, skipped = read_metrics_live(path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["reward_mean"] == 0.9 and skipped == 0
    write_rows(path, [sync_row(1)], tail='["a list"]\n{"no": "step"}\n')
    assert [r["step"] for r in read_metrics_live(path)[0]] == [1] and read_metrics_live(path)[1] == 2


def test_training_routes_need_the_token(train_dirs: tuple[Path, Path]) -> None:
    sync, _ = train_dirs
    with client_for([sync], token="t0ken-for-test") as c:
        for url in ("/api/train", "/api/train/0", "/api/train/0/reward_curve.png", "/static/training.js"):
            assert c.get(url).status_code == 401, url
        auth = {"Authorization": "Bearer t0ken-for-test"}
        assert c.get("/api/train", headers=auth).json()[0]["summary"]["steps"] == STEPS
        png = c.get("/api/train/0/reward_curve.png", headers=auth)
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert "trainingPage" in c.get("/static/training.js", headers=auth).text


def test_command_takes_training_runs_with_train(train_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    sync, async_ = train_dirs
    for args, expected in (
        ([str(sync)], f"give it as --train {sync}"),
        ([], "give a run directory"),
        (["--train", str(tmp_path / "nothing")], "does not exist"),
    ):
        proc = subprocess.run([*CLI, "dashboard", *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and expected in proc.stderr, (args, proc.stderr)
    with DashboardServer([], "--train", str(sync), "--train", str(async_ / "metrics.jsonl")) as server:
        listed = httpx.get(server.url + "api/train").json()
        assert [r["path"] for r in listed] == [str(sync), str(async_)]
    assert "0 run(s) and 2 training run(s)" in (server.proc.stdout.read() if server.proc.stdout else "")


# -- a verl run: `uniagent train --engine verl` with a local config -----------------------------------------
def verl_metrics(step: int) -> dict[str, Any]:
    """Keys verl's trainers log for a step (a selection, real names), with uniagent's."""
    return {
        "training/global_step": step,
        "critic/score/mean": 0.25 * step,
        "actor/pg_loss": 0.1,
        "actor/pg_clipfrac": 0.02,
        "actor/grad_norm": 0.7,
        "timing_s/step": 100.0 + step,
        "timing_s/gen": 20.0,
        "timing_s/update_actor": 60.0,
        "perf/throughput": 300.0,
        "response_length/mean": 50.0,
        "uniagent/episodes": 4.0,
        "uniagent/resolved_rate": 0.25,
        "uniagent/untrainable": 1.0,
        "uniagent/exit/finished": 3.0,
        "uniagent/exit/sandbox_dead": 1.0,
        "uniagent/policy_version/min": float(step - 2),
    }


def test_a_verl_runs_metrics_and_checkpoints_read_as_a_training_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's own `FileLogger` writes `trainer.output/metrics.jsonl` (as the launch has it do): the
    page gets its keys under the page's names, every verl key kept, a step's several rows merged
    (the fully-async trainer logs its timings, then the step), and verl's checkpoints."""
    require_module("verl", "verl writes these rows (pip install -e .[verl])")
    from verl.utils.tracking import FileLogger

    out = tmp_path / "train_verl"
    for step in (1, 2):
        (out / "checkpoints" / f"global_step_{step}" / "actor").mkdir(parents=True)
    (out / "checkpoints" / "global_step_10").mkdir()
    (out / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("10")
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(out / "metrics.jsonl"))
    logger = FileLogger("uniagent", "train_verl")
    for step in (1, 2):
        logger.log({"timing_s/param_sync": 1.5, "fully_async/count/current_param_version": step}, step=step)
        logger.log(verl_metrics(step), step=step)
    logger.finish()
    with client_for([out]) as c:
        run = c.get("/api/train/0").json()
    assert [r["step"] for r in run["rows"]] == [1, 2] and run["skipped_lines"] == 0
    row = run["rows"][1]
    assert {
        k: row[k] for k in ("reward_mean", "step_s", "rollout_s", "update_s", "loss", "resolved_rate")
    } == {
        "reward_mean": 0.5,
        "step_s": 102.0,
        "rollout_s": 20.0,
        "update_s": 60.0,
        "loss": 0.1,
        "resolved_rate": 0.25,
    }
    assert row["exit_reasons"] == {"finished": 3, "sandbox_dead": 1}
    assert row["rollout_tokens_per_s"] == pytest.approx(50.0 * 4 / 20.0)
    assert row["mode"] == "async" and row["policy_version"] == 2 and row["staleness_max"] == 2
    assert {k: v for k, v in row.items() if k in verl_metrics(2)} == verl_metrics(2)  # every verl key kept
    assert row["timing_s/param_sync"] == 1.5  # from the step's first row
    summary = run["summary"]
    assert summary["steps"] == 2 and summary["reward_last"] == pytest.approx(0.375)
    assert summary["wall_s"] == pytest.approx(203.0) and summary["untrainable"] == 2
    assert summary["staleness_max"] == 2 and summary["mode"] == "async"
    assert run["checkpoints"] == ["global_step_1", "global_step_2", "global_step_10"]


@needs("Chromium", CHROMIUM.exists(), "apt-get install chromium (Debian's, at /usr/bin/chromium)")
def test_the_page_overlays_two_runs_and_follows_a_growing_run(page, train_dirs) -> None:  # noqa: F811
    sync, async_ = train_dirs
    with DashboardServer([], "--train", str(sync), "--train", str(async_)) as server:
        page.goto(server.url)
        page.wait_for_selector(".card.train[data-train='1']")
        assert page.locator(".card.train").count() == 2
        assert page.locator(".card.train[data-train='0'] .n-steps").inner_text() == str(STEPS)
        page.check("input.train-pick[data-train='0']")
        page.check("input.train-pick[data-train='1']")
        page.click("a#train-compare")
        page.wait_for_selector("#chart-reward svg")
        assert page.url.endswith("#/train/0,1")
        assert page.locator("#train-title").inner_text() == "Training runs: train_sync vs train_async"
        # Reward and resolved rate for both runs: four lines on the one chart, one point per step.
        lines = page.eval_on_selector_all(
            "#chart-reward path.series", "ps => ps.map(p => [+p.dataset.run, p.dataset.key])"
        )
        assert sorted(lines) == [[run, key] for run in (0, 1) for key in ("resolved_rate", "reward_mean")]
        assert page.locator("#chart-reward circle").count() == 4 * STEPS - 2
        # The sync run's step without a reward breaks its line rather than drawing a zero.
        sync_reward = page.get_attribute(
            "#chart-reward path.series[data-run='0'][data-key='reward_mean']", "d"
        )
        assert sync_reward.count("M") == 2 and sync_reward.count("L") == STEPS - 3
        # Keys only the async run logs: its lines alone; the sync run's cells show "–".
        assert page.eval_on_selector_all("#chart-idle path.series", "ps => ps.map(p => +p.dataset.run)") == [
            1,
            1,
        ]
        bars = page.eval_on_selector_all(
            "#chart-staleness rect.stale-bar",
            "rs => rs.map(r => [+r.dataset.run, +r.dataset.lag, +r.dataset.n])",
        )
        assert bars == [[1, 0, 8 + 5 * (STEPS - 1)], [1, 1, 3 * (STEPS - 1)]]
        cell = "#train-summary tr[data-row='{1}'] td[data-train='{0}']"
        assert page.inner_text(cell.format(0, "mode")) == "–"
        assert page.inner_text(cell.format(0, "staleness max")) == "–"
        assert page.inner_text(cell.format(0, "trainer idle")) == "–"
        assert page.inner_text(cell.format(1, "mode")) == "async"
        assert page.inner_text(cell.format(1, "policy version")) == str(STEPS)
        for chart in ("loss", "clipfrac", "ppo-kl", "mismatch", "step-s", "tok-s"):
            assert page.locator(f"#chart-{chart} path.series").count() >= 2, chart
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard_training.png"), full_page=True)

        # The trainer finishes the half-written row and writes another: the open page follows.
        page.evaluate("window.__not_reloaded = true")
        rest = json.dumps(async_row(STEPS + 1))[40:]
        append(async_ / "metrics.jsonl", rest + "\n" + json.dumps(async_row(STEPS + 2)) + "\n")
        page.wait_for_function(
            f"document.querySelectorAll('#chart-reward circle').length === {4 * STEPS + 2}", timeout=15_000
        )
        assert page.inner_text(cell.format(1, "policy version")) == str(STEPS + 2)
        assert page.evaluate("window.__not_reloaded") is True

        # The overlay chips take a run off the chart.
        page.click("#train-overlay a[data-train='0']")
        page.wait_for_function("location.hash === '#/train/1'")
        page.wait_for_function("document.querySelectorAll('#chart-reward path.series').length === 2")
        assert page.locator("#train-summary th[data-train]").count() == 1
