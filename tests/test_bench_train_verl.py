"""bench/train_verl.py without launching verl (tests/test_verl_cpu.py runs verl end to end): its reading,
aggregation and verdicts on rows a real bench run wrote (tests/fixtures/bench_train_verl: 2 steps of 2
tasks x 2 samples per side and mode, verl's file-logger rows and rollout events, the local trainer's
metrics.jsonl), on crafted verl rows for the goal, its --print commands, and its child path on a config
the real `uniagent train --engine verl` rejects before starting anything (seconds)."""

from __future__ import annotations

import fcntl
import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # the bench's modules import each other as scripts do

import train_verl  # noqa: E402
import train_verl_rows  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "bench_train_verl"
TINY = ["--steps", "2", "--tasks-per-step", "2", "--group-size", "2"]


def lines(out: str) -> dict[tuple[str, str | None, str | None], dict]:
    parsed = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert all(p["bench"] == "train_verl" for p in parsed)
    return {(p["figure"], p.get("mode"), p.get("side")): p for p in parsed}


def raw(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """The fixture's run tree as a bench OUT (the bench writes its summary there)."""
    shutil.copytree(FIXTURE, tmp_path / "out")
    return tmp_path / "out"


def test_dry_run_on_real_rows_prints_every_figure_and_the_ratios(out: Path, capsys) -> None:
    summary = train_verl.main(["--dry-run", "--out", str(out), "--goal", "none", *TINY])
    got = lines(capsys.readouterr().out)
    for mode in ("sync", "async"):
        for side in ("local", "verl"):
            wall = got[("wall_per_step_median_s", mode, side)]
            assert wall["n"] == 1 and wall["min"] == wall["value"] == wall["max"] > 0  # step 2 (1 warm-up)
            assert got[("generated_tokens_per_wall_s", mode, side)]["value"] > 0
            # >= 0: fully async verl generated all 4 prompts' episodes ahead, before step 1's sync
            assert got[("tokens_per_s_after_warmup", mode, side)]["value"] >= (mode == "sync")
            for idle in ("trainer_idle_frac_mean", "engine_idle_frac_mean"):
                assert 0.0 <= got[(idle, mode, side)]["value"] <= 1.0
            assert len(got[("reward_curve", mode, side)]["value"]) == 2
        # the curve is verl's own score of each trained batch, in training order
        rows = [
            r["data"] for r in raw(out / "verl" / mode / "metrics.jsonl") if "critic/score/mean" in r["data"]
        ]
        by_step = {
            int(d.get("training/global_step", i + 1)): d["critic/score/mean"] for i, d in enumerate(rows)
        }
        assert got[("reward_curve", mode, "verl")]["value"] == pytest.approx(
            [by_step[1], by_step[2]], abs=1e-4
        )
        local = [r["reward_mean"] for r in raw(out / "local" / mode / "metrics.jsonl") if "step" in r]
        assert got[("reward_curve", mode, "local")]["value"] == pytest.approx(local, abs=1e-4)
        ratio = got[("verl_vs_local_wall_per_step", mode, None)]
        assert ratio["value"] == pytest.approx(ratio["verl"] / ratio["local"], rel=1e-3)
        assert ratio["verl"] == pytest.approx(
            got[("wall_per_step_median_s", mode, "verl")]["value"], abs=1e-3
        )
        assert "met" in got[("verl_reward_rises_beyond_noise", mode, None)]
    stored = json.loads((out / train_verl.SUMMARY).read_text())
    assert stored["modes"].keys() == summary["modes"].keys() == {"sync", "async"}
    assert (out / train_verl.PNG).read_bytes()[:4] == b"\x89PNG"


def test_verl_rows_time_each_step_by_the_servers_weight_syncs(out: Path) -> None:
    """Step ends are the rollout server's `update` events (the initial sync, then one per step); the
    tokens are what it generated in between; fully async's late, twice-labelled rows land once each."""
    for mode in ("sync", "async"):
        events = raw(out / "verl" / mode / train_verl.EVENTS)
        rows = train_verl_rows.verl_rows(raw(out / "verl" / mode / "metrics.jsonl"), events, mode, 4)
        assert [r["step"] for r in rows] == [1, 2]
        updates = sorted(e["time"] for e in events if e["event"] == "update")
        assert [r["time"] for r in rows] == updates[1:3]
        assert rows[0]["step_s"] == pytest.approx(updates[1] - updates[0])
        generated = sum(e["tokens"] for e in events if e["event"] in ("generated", "aborted"))
        assert 0 < rows[0]["generated_tokens"] + rows[1]["generated_tokens"] <= generated
    assert all(r["trainer_idle_frac"] is not None and r["engine_idle_frac"] is not None for r in rows)


def test_verl_rows_without_events_fall_back_to_verls_step_timer(out: Path) -> None:
    metrics = raw(out / "verl" / "sync" / "metrics.jsonl")
    rows = train_verl_rows.verl_rows(metrics, [], "sync", 4)
    assert [r["step_s"] for r in rows] == [m["data"]["timing_s/step"] for m in metrics]
    assert "time" not in rows[0] and "generated_tokens" not in rows[0]
    assert 0 < rows[0]["rollout_s"] < rows[0]["step_s"]  # the trainer waits through the rollout


def verl_metrics(directory: Path, scores: list[float]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        {"step": i, "data": {"critic/score/mean": s, "timing_s/step": 100.0, "timing_s/gen": 25.0}}
        for i, s in enumerate(scores, 1)
    ]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(
    ("scores", "code"), [([0.0, 0.1, 0.0, 0.1, 0.9, 1.0, 1.0, 0.9], None), ([0.2] * 8, 1)]
)
def test_goal_rise_fails_a_curve_within_noise(tmp_path: Path, scores: list[float], code, capsys) -> None:
    verl_metrics(tmp_path / "verl" / "sync", scores)
    argv = ["--dry-run", "--out", str(tmp_path), "--modes", "sync", "--sides", "verl", "--steps", "8"]
    if code is None:
        train_verl.main(argv)
    else:
        with pytest.raises(SystemExit) as exc:
            train_verl.main(argv)
        assert exc.value.code == code and "within noise" in capsys.readouterr().err
    train_verl.main([*argv, "--goal", "none"])  # no goal: figures only


def test_max_ratio_fails_a_verl_slower_than_allowed(out: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        train_verl.main(["--dry-run", "--out", str(out), "--goal", "none", "--max-ratio", "0.01", *TINY])
    assert exc.value.code == 1 and "verl / local wall per step" in capsys.readouterr().err


def test_a_run_short_of_its_steps_gives_no_figures(tmp_path: Path) -> None:
    verl_metrics(tmp_path / "verl" / "sync", [0.5])
    with pytest.raises(SystemExit, match=r"verl sync: 1 of 2 steps"):
        train_verl.main(["--dry-run", "--out", str(tmp_path), "--modes", "sync", "--sides", "verl", *TINY])


def test_print_composes_the_same_settings_for_both_trainers(tmp_path: Path, capsys) -> None:
    train_verl.main(["--print", "--out", str(tmp_path), "--seed", "3", *TINY])
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert [c[c.index("--engine") + 1] for c in commands] == ["local", "verl", "local", "verl"]

    def sets(cmd: list[str]) -> list[str]:
        return [cmd[i + 1] for i, c in enumerate(cmd) if c == "--set"]

    for local, verl in (commands[0:2], commands[2:4]):
        shared = [s for s in sets(local) if not s.startswith("trainer.output=")]
        assert [s for s in sets(verl) if not s.startswith("trainer.output=")][: len(shared)] == shared
        tiny = {"trainer.steps=2", "trainer.tasks_per_step=2", "trainer.group_size=2", "trainer.seed=3"}
        assert tiny <= set(shared)
        assert "trainer.logger=[console,file]" in sets(verl) and "trainer.save_freq=-1" in sets(verl)
        assert any(
            s.startswith("+actor_rollout_ref.rollout.custom={uniagent_local_events:") for s in sets(verl)
        )
    assert "trainer.mode=sync" in sets(commands[1]) and "trainer.mode=async" in sets(commands[3])


def test_a_verl_run_that_fails_stops_the_bench_with_its_console_tail(tmp_path: Path) -> None:
    """The real `uniagent train --engine verl` child on a config it rejects before starting verl."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  no_such_knob: 1\n")
    argv = ["--config", str(bad), "--modes", "sync", "--sides", "verl", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=r"(?s)verl sync training exited \d+.*no_such_knob"):
        train_verl.main([*argv, "--lock", str(tmp_path / "lock")])
    assert (tmp_path / "out" / "verl" / "sync.log").exists()


def test_lock_is_held_for_the_run_and_released_after(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with train_verl.locked(str(path)), open(path) as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(path) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_spread_and_ratio_helpers() -> None:
    assert train_verl_rows.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert train_verl_rows.spread([])["median"] is None
    rows = [
        {"step_s": 5.0, "time": 105.0, "generated_tokens": 50},
        {"step_s": 9.0, "time": 112.0, "generated_tokens": 70},
    ]
    assert train_verl_rows.step_walls(rows) == [5.0, 7.0]
    figures = train_verl_rows.per_step(rows, warmup=1)
    assert figures["wall_per_step"]["median"] == 7.0 and figures["tokens_per_s_after_warmup"] == 10.0
    assert train_verl_rows.per_step(rows, warmup=5)["wall_per_step"]["n"] == 1  # the last step is kept
