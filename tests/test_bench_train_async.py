"""bench/train_async.py's summary, pairing, ratios, gates and figure on crafted `metrics.jsonl` files (no
model: the training runs are the bench's job), its run order, and its child-process path on a config
the real `uniagent train` rejects (seconds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from uniagent.train.outputs import plot_comparison, plot_rewards, staleness_totals, wall_clock

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # the bench's modules import each other as scripts do

import train_async  # noqa: E402
import train_async_summary  # noqa: E402
from roofline import transformer_flops, update_flops  # noqa: E402

# a tiny decoder and a made-up machine: the utilisation figures without loading a model or measuring
TINY = SimpleNamespace(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000
)
PEAK = {"fp32_gflops": 100.0, "bf16_gflops": 800.0}


@pytest.fixture(autouse=True)
def tiny_costing(monkeypatch):
    monkeypatch.setattr(train_async, "costing", lambda *_: train_async_summary.Costing(TINY, "float32", PEAK))


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def rows(mode: str, step_s: float, rewards: list[float], **extra: object) -> list[dict]:
    """Metrics rows as the trainer writes them: stamped at each step's end, 12 episodes a step."""
    out, now = [], 1000.0
    for i, reward in enumerate(rewards, 1):
        now += step_s
        row = {
            "step": i,
            "mode": mode,
            "reward_mean": reward,
            "episodes": 12,
            "untrainable": 0,
            "episodes_trained": 12,
            "rollout_tokens_per_s": 40.0 if mode == "sync" else 30.0,
            "generated_tokens": 1000,
            "rollout_s": 0.75 * step_s,
            "update_s": 0.25 * step_s,
            "step_s": step_s,
            "time": now,
            **extra,
        }
        out.append(row)
    return out


def write(directory: Path, metrics: list[dict]) -> Path:
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    return directory


RISING = [0.1, 0.15, 0.1, 0.2, 0.4, 0.5, 0.55, 0.6]


def lines(out: str, pair: int | str = 1) -> dict[tuple[str, str | None], dict]:
    """The figures of one pair (1: the first; "all": the medians over pairs), by (figure, mode)."""
    parsed = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert all(p["bench"] == "train_async" for p in parsed)
    return {(p["figure"], p.get("mode")): p for p in parsed if p.get("pair", pair) == pair}


def async_rows(step_s: float = 50.0, rewards: list[float] = RISING) -> list[dict]:
    return rows(
        "async",
        step_s,
        rewards,
        staleness_hist={"0": 8, "1": 4},
        trainer_idle_frac=0.1,
        engine_idle_frac=0.2,
    )


def test_from_two_runs_prints_each_figure_the_ratio_and_writes_png_and_summary(tmp_path, capsys):
    sync = write(tmp_path / "s", rows("sync", 100.0, RISING))
    asyn = write(tmp_path / "a", async_rows())
    out = tmp_path / "out"
    summary = train_async.main(["--from", str(sync), str(asyn), "--out", str(out)])
    printed = capsys.readouterr().out
    got = lines(printed)

    assert got[("wall_per_step_s", "sync")]["value"] == pytest.approx(100.0)
    assert got[("wall_per_step_s", "async")]["value"] == pytest.approx(50.0)
    assert got[("train_wall_s", "async")]["value"] == pytest.approx(400.0)
    assert got[("sync_vs_async_wall_per_step", None)]["value"] == pytest.approx(2.0)
    ratio = lines(printed, "all")[("sync_vs_async_wall_per_step", None)]
    assert ratio["value"] == pytest.approx(2.0) and ratio["goal"] == 1.5 and ratio["met"] is True
    assert ratio["runs"] == [2.0] and ratio["min"] == ratio["max"] == 2.0
    assert got[("rollout_tokens_per_s_median", "sync")]["value"] == 40.0
    assert got[("generated_tokens_per_wall_s", "sync")]["value"] == pytest.approx(10.0)  # 1000 per 100 s
    assert got[("generated_tokens_per_wall_s", "async")]["value"] == pytest.approx(20.0)
    # sync rows without idle keys: from the phases (the trainer waits through the rollout)
    assert got[("trainer_idle_frac_mean", "sync")]["value"] == pytest.approx(0.75)
    assert got[("engine_idle_frac_mean", "sync")]["value"] == pytest.approx(0.25)
    assert got[("trainer_idle_frac_mean", "async")]["value"] == pytest.approx(0.1)
    # 8 steps: windows of 2 steps; (0.1 + 0.15) / 2 -> (0.55 + 0.6) / 2
    assert got[("reward_first", "sync")]["value"] == pytest.approx(0.125)
    assert got[("reward_last", "async")]["value"] == pytest.approx(0.575)
    # no untrained run given: learning is measured from the first window, and says so
    assert got[("gain_from", "async")]["value"] == "first" and got[("learned", "async")]["value"] is True
    assert got[("episodes_trained", "sync")]["value"] == 96
    assert got[("reward_gain_per_100_episodes", "sync")]["value"] == pytest.approx(
        45 / 96, abs=1e-4
    )  # printed to 4 decimals
    assert got[("staleness_hist", "async")]["value"] == {"0": 64, "1": 32}
    assert got[("staleness_max", "async")]["value"] == 1
    assert got[("staleness_hist", "sync")]["value"] == {}
    same = got[("async_minus_sync_reward_last", None)]
    assert same["value"] == pytest.approx(0.0) and same["within_noise"] is True and same["noise"] > 0
    assert got[("async_minus_sync_gain_per_100_episodes", None)]["not_worse"] is True
    assert lines(printed, None)[("goals_met", None)]["value"] is True and summary["goals_met"] is True

    png = out / train_async.PNG
    assert png.read_bytes()[:8] == PNG_MAGIC and summary["png"] == str(png)
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2] == (800, 1200)  # 2x2 panels at 12x8 in, 100 dpi
    stored = json.loads((out / train_async.SUMMARY).read_text())
    assert stored["ratios"]["sync_vs_async_wall_per_step"]["met"] is True
    assert stored["runs"][0]["figures"]["reward_curve"] == RISING


def test_modes_come_from_the_rows_not_the_argument_order(tmp_path, capsys):
    sync = write(tmp_path / "s", rows("sync", 100.0, RISING))
    asyn = write(tmp_path / "a", async_rows())
    train_async.main(["--from", str(asyn), str(sync), "--out", str(tmp_path / "out")])
    got = lines(capsys.readouterr().out)
    assert got[("sync_vs_async_wall_per_step", None)]["value"] == pytest.approx(2.0)
    assert got[("staleness_hist", "async")]["value"] == {"0": 64, "1": 32}


def test_slow_async_that_learns_worse_fails_every_verdict(tmp_path, capsys):
    sync = write(tmp_path / "s", rows("sync", 100.0, RISING))
    flat = [0.1, 0.12, 0.1, 0.08, 0.1, 0.1, 0.09, 0.1]
    asyn = write(tmp_path / "a", async_rows(step_s=80.0, rewards=flat))
    argv = ["--from", str(sync), str(asyn), "--out", str(tmp_path / "out"), "--window", "3", "--warmup", "2"]
    summary = train_async.main(argv)
    printed = capsys.readouterr().out
    got = lines(printed)
    assert got[("sync_vs_async_wall_per_step", None)]["value"] == pytest.approx(1.25)
    every = lines(printed, "all")
    # with --warmup the goal is on the steps after it (a one-time first step is in the process ratio)
    assert "met" not in every[("sync_vs_async_wall_per_step", None)]
    assert every[("sync_vs_async_wall_per_step_after_warmup", None)]["met"] is False
    assert got[("wall_per_step_after_warmup_s", "async")]["value"] == pytest.approx(80.0)  # steps 3-8
    assert got[("sync_vs_async_wall_per_step_after_warmup", None)]["value"] == pytest.approx(1.25)
    assert got[("sync_vs_async_wall_per_generated_token_after_warmup", None)]["value"] == pytest.approx(1.25)
    assert got[("learned", "async")]["value"] is False and got[("learned", "sync")]["value"] is True
    assert got[("async_minus_sync_reward_last", None)]["within_noise"] is False
    assert got[("async_minus_sync_gain_per_100_episodes", None)]["not_worse"] is False
    assert summary["goals"] == {
        "sync_vs_async_wall_per_step_after_warmup": False,
        "sync_learns": True,
        "async_learns": False,
    }
    assert summary["goals_met"] is False


def test_pairs_give_each_ratio_per_pair_with_median_and_spread(tmp_path, capsys):
    """Two pairs whose sync side drifts (100 -> 120 s a step); async generates twice the tokens in its
    second pair: the per-token ratio sees it, the per-step one does not; process walls from the bench."""
    dirs = []
    for pair, (sync_s, async_s, tokens) in enumerate([(100.0, 50.0, 1000), (120.0, 40.0, 2000)], 1):
        s = write(tmp_path / f"s{pair}", rows("sync", sync_s, RISING))
        a = write(tmp_path / f"a{pair}", async_rows(step_s=async_s))
        if tokens != 1000:
            (a / "metrics.jsonl").write_text(
                "".join(
                    json.dumps({**r, "generated_tokens": tokens}) + "\n" for r in async_rows(step_s=async_s)
                )
            )
        (s / train_async.PROCESS).write_text(json.dumps({"process_wall_s": 8 * sync_s + 30}))
        (a / train_async.PROCESS).write_text(json.dumps({"process_wall_s": 8 * async_s + 30}))
        dirs += [str(s), str(a)]
    summary = train_async.main(["--from", *dirs, "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    per_step = [lines(printed, p)[("sync_vs_async_wall_per_step", None)]["value"] for p in (1, 2)]
    assert per_step == [pytest.approx(2.0), pytest.approx(3.0)]
    every = lines(printed, "all")
    step = every[("sync_vs_async_wall_per_step", None)]
    assert step["value"] == pytest.approx(2.5) and step["min"] == 2.0 and step["max"] == 3.0
    # per generated token: (sync s/token) / (async s/token) = 2.0, then 3.0 x 2 = 6.0
    token = every[("sync_vs_async_wall_per_generated_token", None)]
    assert token["runs"] == [pytest.approx(2.0), pytest.approx(6.0)] and token["value"] == pytest.approx(4.0)
    process = every[("sync_vs_async_process_wall", None)]
    assert process["runs"] == [pytest.approx(830 / 430, abs=1e-4), pytest.approx(990 / 350, abs=1e-4)]
    wall = every[("wall_per_step_s", "sync")]
    assert (wall["value"], wall["min"], wall["max"]) == (pytest.approx(110.0), 100.0, 120.0)
    assert every[("process_wall_s", "async")]["runs"] == [430.0, 350.0]
    assert [p["pair"] for p in summary["pairs"]] == [1, 2]


def test_learning_is_measured_against_the_untrained_policy(tmp_path, capsys):
    """The first window already holds a learned step: the untrained run is the baseline, its noise
    counted; a run that only reaches the untrained reward has not learned."""
    untrained = write(tmp_path / "u", rows("sync", 100.0, [0.1, 0.2, 0.1, 0.2, 0.1, 0.2, 0.1, 0.2]))
    sync = write(tmp_path / "s", rows("sync", 100.0, [0.1, 0.5, 0.6, 0.7, 0.8, 0.8, 0.9, 0.9]))
    asyn = write(tmp_path / "a", async_rows(rewards=[0.1, 0.1, 0.2, 0.1, 0.2, 0.1, 0.2, 0.15]))
    argv = ["--from", str(sync), str(asyn), "--untrained", str(untrained), "--out", str(tmp_path / "out")]
    summary = train_async.main(argv)
    printed = capsys.readouterr().out
    base = lines(printed, None)[("reward_untrained", None)]
    assert base["value"] == pytest.approx(0.15) and base["episodes"] == 96
    assert base["noise"] == pytest.approx(2 * (0.15 * 0.85 / 96) ** 0.5, abs=1e-4)
    assert base["same_first_step_as_sync"] is True  # step 1 precedes any update: the same samples
    got = lines(printed)
    assert got[("gain_from", "sync")]["value"] == "untrained"
    assert got[("reward_gain_over_untrained", "sync")]["value"] == pytest.approx(0.9 - 0.15)
    assert got[("learned", "sync")]["value"] is True and got[("learned", "async")]["value"] is False
    assert summary["goals"]["async_learns"] is False and summary["goals_met"] is False


def test_update_mfu_from_the_positions_run_and_update_seconds_prefill_mfu_only_when_timed():
    steps = rows("sync", 100.0, RISING, train_tokens=500, engine={"prefill_tokens": 4000, "prefill_s": 2.0})
    costing = train_async_summary.Costing(TINY, "float32", PEAK)
    got = train_async_summary.summarise_run(steps, costing=costing)
    # rows without forward_tokens count their trained tokens
    flops = 8 * update_flops(TINY, {"train_tokens": 500, "episodes": 12})
    assert got["update_gflops_per_s"] == pytest.approx(flops / (8 * 25.0) / 1e9)
    assert got["update_mfu"] == pytest.approx(flops / 200.0 / 1e9 / 100.0, abs=1e-4)
    assert got["update_mfu_of_bf16_peak"] == pytest.approx(got["update_mfu"] / 8, abs=1e-4)
    prefill = transformer_flops(TINY, 8 * 4000)
    assert got["rollout_prefill_mfu"] == pytest.approx(prefill / 16.0 / 1e9 / 100.0, abs=1e-4)
    untimed = rows("sync", 100.0, RISING, train_tokens=500, engine={"prefill_tokens": 4000})
    assert train_async_summary.summarise_run(untimed, costing=costing)["rollout_prefill_mfu"] is None
    bf16 = train_async_summary.Costing(TINY, "bfloat16", PEAK)
    assert (
        train_async_summary.summarise_run(steps, costing=bf16)["update_mfu"] == got["update_mfu_of_bf16_peak"]
    )
    # rows that count the positions the update ran (a shared prefix once, logits from the responses on)
    ran = rows("sync", 100.0, RISING, train_tokens=500, forward_tokens=900, logit_tokens=600, episodes=4)
    more = train_async_summary.summarise_run(ran, costing=costing)
    assert more["update_tokens_counted"] == 8 * 900
    head = transformer_flops(TINY, 900, 900 / 4 / 2, True, 600)
    assert more["update_gflops_per_s"] == pytest.approx(8 * head / (8 * 25.0) / 1e9)


def test_runs_of_one_mode_unpaired_or_a_missing_metrics_file_say_what_to_pass(tmp_path):
    one = write(tmp_path / "one", rows("sync", 10.0, RISING))
    two = write(tmp_path / "two", rows("sync", 10.0, RISING))
    with pytest.raises(SystemExit, match="pass as many sync as async runs"):
        train_async.main(["--from", str(one), str(two), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"metrics\.jsonl does not exist"):
        train_async.main(["--from", str(one), str(tmp_path / "nope"), "--out", str(tmp_path / "out")])


def test_dry_run_summarises_the_out_dirs_of_an_earlier_run(tmp_path, capsys):
    write(tmp_path / "sync", rows("sync", 60.0, RISING, trainer_idle_frac=0.5, engine_idle_frac=None))
    train_async.main(["--dry-run", "--modes", "sync", "--out", str(tmp_path)])
    got = lines(capsys.readouterr().out)
    assert got[("wall_per_step_s", "sync")]["value"] == pytest.approx(60.0)
    assert got[("trainer_idle_frac_mean", "sync")]["value"] == 0.5  # a recorded share wins
    assert got[("engine_idle_frac_mean", "sync")]["value"] == 0.25  # a missing one: the update's share
    assert ("sync_vs_async_wall_per_step", None) not in got  # one mode: nothing to compare
    assert (tmp_path / train_async.PNG).read_bytes()[:8] == PNG_MAGIC


def test_dry_run_finds_the_pairs_and_the_untrained_run(tmp_path, capsys):
    write(tmp_path / "untrained", rows("sync", 100.0, [0.1] * 8))
    for pair in (1, 2):
        write(tmp_path / f"pair{pair}" / "sync", rows("sync", 100.0, RISING))
        write(tmp_path / f"pair{pair}" / "async", async_rows())
    summary = train_async.main(["--dry-run", "--out", str(tmp_path)])
    assert [(r["mode"], r["pair"]) for r in summary["runs"]] == [
        ("sync", 1),
        ("async", 1),
        ("sync", 2),
        ("async", 2),
    ]
    assert summary["untrained"]["reward"] == pytest.approx(0.1)
    assert summary["ratios"]["sync_vs_async_wall_per_step"]["runs"] == [2.0, 2.0]
    assert "reward_untrained" in capsys.readouterr().out


def test_the_untrained_run_comes_first_then_the_pairs_alternate(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        train_async, "train_run", lambda args, mode, out, extra=(): calls.append((mode, out, extra))
    )
    args = train_async.build_parser().parse_args(["--pairs", "2", "--steps", "3", "--out", str(tmp_path)])
    train_async.train_all(args, ["sync", "async"])
    assert [(m, str(o.relative_to(tmp_path))) for m, o, _ in calls] == [
        ("sync", "untrained"),
        ("sync", "pair1/sync"),
        ("async", "pair1/async"),
        ("sync", "pair2/sync"),
        ("async", "pair2/async"),
    ]
    assert list(calls[0][2]) == [train_async.NO_LEARNING, "trainer.steps=3"] and not calls[1][2]
    calls.clear()
    args = train_async.build_parser().parse_args(
        ["--pairs", "1", "--untrained-steps", "0", "--out", str(tmp_path)]
    )
    train_async.train_all(args, ["async"])
    assert [m for m, _, _ in calls] == ["async"]


def test_train_command_sets_mode_seed_output_then_the_users_overrides(tmp_path):
    args = train_async.build_parser().parse_args(
        ["--steps", "3", "--seed", "7", "--set", "trainer.save_every=2", "--set", "model.max_tokens=8"]
    )
    cmd = train_async.train_command(args, "async", tmp_path / "async", [train_async.NO_LEARNING])
    assert cmd[cmd.index("train") :][:5] == ["train", "--engine", "local", "--config", str(args.config)]
    sets = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--set"]
    assert sets == [
        "trainer.mode=async",
        "trainer.seed=7",
        f"trainer.output={tmp_path / 'async'}",
        "trainer.save_every=0",
        "trainer.steps=3",
        train_async.NO_LEARNING,
        "trainer.save_every=2",  # the user's, after the bench's: it wins
        "model.max_tokens=8",
    ]


def test_a_training_that_fails_stops_the_bench_with_its_console_tail(tmp_path):
    """The real `uniagent train` child on a config it rejects before loading any model."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  no_such_knob: 1\n")
    argv = ["--config", str(bad), "--modes", "sync", "--untrained-steps", "0", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=r"(?s)sync training exited 2.*no_such_knob"):
        train_async.main(argv)
    assert (tmp_path / "out" / "pair1" / "sync.log").exists()


def test_reward_noise_pools_both_windows():
    """A window that scored all 0 still has noise: p is pooled over both windows (4 episodes each)."""
    assert train_async_summary.diff_noise(0.0, 4, 0.5, 4) == pytest.approx(2 * (0.25 * 0.75 * 0.5) ** 0.5)
    assert train_async_summary.diff_noise(0.0, 4, 0.0, 4) == 0.0  # nothing varies: no noise to hide behind


def test_wall_clock_from_stamps_or_step_sums():
    stamped = [{"step_s": 5.0, "time": 105.0}, {"step_s": 99.0, "time": 112.0}]
    assert wall_clock(stamped) == [5.0, 12.0]  # stamps win over a step_s that overlaps the next step
    assert wall_clock([{"step_s": 5.0}, {"step_s": 7.0}]) == [5.0, 12.0]
    assert staleness_totals([{"staleness_hist": {"0": 2}}, {"staleness_hist": {"2": 1, "0": 1}}, {}]) == {
        0: 3,
        2: 1,
    }


def test_plots_without_staleness_or_rewards(tmp_path):
    metrics = write(tmp_path / "run", rows("sync", 10.0, RISING)) / "metrics.jsonl"
    assert plot_rewards(metrics, tmp_path / "curve.png") == tmp_path / "curve.png"
    assert plot_comparison({"sync": rows("sync", 10.0, RISING)}, tmp_path / "one.png") == tmp_path / "one.png"
    assert (tmp_path / "one.png").read_bytes()[:8] == PNG_MAGIC
    assert plot_comparison({"sync": [{"step": 1, "reward_mean": None}]}, tmp_path / "none.png") is None
