"""verl's V1 trainer on a CPU-only machine: one GRPO step of `main_ppo` with `trainer.use_v1=True`, and
the infrastructure-failure stop refusing a step's batch there.

Real parts, nothing faked: `python -m verl.trainer.main_ppo` (V1's `TaskRunnerV1` and sync
`PPOTrainer`), TransferQueue on a local Ray cluster, verl's FSDP2 engine over gloo on the CPU platform,
`AgentLoopWorkerTQ` running `UniAgentLoop` on the multi-turn lookup suite (bubblewrap sandboxes), the
`uniagent_local` rollout, and uniagent's replay buffer (`integrations/verl/sampler.py`), which checks
the step's batch for infrastructure failures before verl trains on it. The recipe is
`multiturn_grpo_v1_cpu`; what is read back is what `test_verl_cpu.py` reads (`verl_cpu_helpers.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import require_module

verl = require_module("verl", "verl is the training backend (pip install -e .[verl])")

from verl_cpu_helpers import parse_steps, run_recipe  # noqa: E402


@pytest.mark.slow
def test_verl_cpu_v1_takes_one_grpo_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from uniagent.models.loading import smollm2_hf_dirs

    monkeypatch.setenv("UNIAGENT_PROBE_TOKENIZER", str(smollm2_hf_dirs()[1]))  # the probe's context count
    run = run_recipe(
        tmp_path,
        "multiturn_grpo_v1_cpu",
        [
            # one prompt x 2 samples: the prompt (~550 tokens of instructions) is most of what the update
            # costs; the step's wall time is its longest episode's
            "data.train_batch_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "+uniagent.agent.max_turns=2",
            "actor_rollout_ref.actor.entropy_coeff=0.001",  # a gradient even when a group's rewards tie
            "algorithm.rollout_correction.bypass_mode=False",  # old logprobs recomputed: the probe compares
        ],
        timeout=600,
    )
    assert run.returncode == 0, run.log[-6000:]
    steps = parse_steps(run.log)
    keys = (
        "critic/score/mean",
        "actor/grad_norm",
        "actor/pg_loss",
        "response_length/mean",
        "num_turns/mean",
        "training/infra_failures",
        "training/sessions_checked",
        "training/rollout_logprob_abs_diff_max",
        "training/context_tokens",
        "training/context_tokens_trained",
        "timing_s/gen",
        "timing_s/update_actor",
        "timing_s/update_weights",
        "timing_s/step",
    )
    updates, started = run.events_of("update"), run.events_of("start")
    summary = {
        "wall_s": round(run.wall_s, 1),
        "peak_rss_gib": run.peak_rss_gib,
        "peak_pss_gib": run.peak_pss_gib,
        "steps": {n: {k: m.get(k) for k in keys} for n, m in steps.items()},
        "engine": {"start": started, "updates": updates},
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))

    assert "TaskRunnerV1" in run.log and sorted(steps) == [1], sorted(steps)
    metrics = steps[1]
    # uniagent's replay buffer checked the batch: 1 prompt x 2 sessions, no infrastructure failure
    assert metrics["training/sessions_checked"] == 2 and metrics["training/infra_failures"] == 0
    # verl trained on it: a gradient, old logprobs recomputed that agree with the rollout's (fp32)
    assert metrics["actor/grad_norm"] > 0
    assert metrics["training/rollout_logprob_abs_diff_max"] < 0.05
    # no token of a tool or user message is trained. Under V1 each segment is its own row, and a turn
    # cut at model.max_tokens ends its segment, so a row holds such tokens only when a turn ended
    # by itself before the next message: the probe counts them (`context_tokens`) when there are any
    assert metrics["training/context_tokens_trained"] == 0
    # the engine took verl's weight sync: the initial one (step 0), then the trained weights (step 1)
    assert len(started) == 1 and [u["global_steps"] for u in updates] == [0, 1]
    assert updates[0]["weight_sum"] == pytest.approx(started[0]["weight_sum"], abs=1e-3)
    assert updates[-1]["weight_sum"] != pytest.approx(started[0]["weight_sum"], abs=1e-3)


@pytest.mark.slow
def test_verl_cpu_v1_stops_before_training_a_batch_of_infrastructure_failures(tmp_path: Path) -> None:
    """Every episode's sandbox fails to start (a root filesystem that does not exist): verl's V1 worker
    only tags the group, but uniagent's replay buffer counts 2 of 2 infrastructure failures in step
    1's batch and raises before anything trains, so the run fails with the counts, no step is logged,
    and the engine never gets trained weights (only the initial sync). 1 to 1.5 minutes."""
    run = run_recipe(
        tmp_path,
        "multiturn_grpo_v1_cpu",
        [
            "data.train_batch_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "+uniagent.sandbox.rootfs=/nonexistent-rootfs",
            "+uniagent.sandbox.start_retries=0",
        ],
        timeout=600,
    )
    print(json.dumps({"wall_s": round(run.wall_s, 1), "returncode": run.returncode}))
    assert run.returncode != 0
    assert "TrainingError: verl V1 training batch of step 1 (1 group(s) x 2): 2 of 2 episodes" in run.log
    assert "uniagent.max_infra_failure_share=0.5" in run.log and "/nonexistent-rootfs" in run.log
    assert parse_steps(run.log) == {}
    assert [u["global_steps"] for u in run.events_of("update")] == [0]
