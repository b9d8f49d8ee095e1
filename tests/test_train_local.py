"""The local trainer: verl's math, mask handling, exclusion of infrastructure failures, weights shared
with the rollout engine, checkpoints and resume, and a short real run through the CLI.

Everything is real: the packaged SmolLM2-135M weights, bubblewrap sandboxes, verl's `core_algos`.
Sizes are tiny because the suite runs on a shared 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import require_module
from uniagent.agent.result import EpisodeResult, ExitReason, Reward
from uniagent.errors import ConfigError
from uniagent.models.base import SamplingParams
from uniagent.tokens import Trajectory
from uniagent.train import algo, mismatch
from uniagent.train.config import build_train_config
from uniagent.train.toy import ToyTask, load_toy_tasks

core_algos = require_module("verl.trainer.ppo.core_algos", "the training losses (pip install -e .[verl])")


def _traj(prompt: int, parts: list[tuple[str, int]], seed: int = 0) -> Trajectory:
    """A trajectory with model/context parts of the given lengths and made-up logprobs."""
    g = torch.Generator().manual_seed(seed)
    t = Trajectory(prompt_ids=torch.randint(10, 1000, (prompt,), generator=g).tolist())
    for kind, n in parts:
        ids = torch.randint(10, 1000, (n,), generator=g).tolist()
        if kind == "model":
            t.add_generation(ids, (-torch.rand(n, generator=g)).tolist())
        else:
            t.add_context(ids)
    return t


def _episode(traj: Trajectory | None, reward: float | None, reason: ExitReason) -> EpisodeResult:
    value = None if reward is None else Reward(reward, reward == 1.0)
    return EpisodeResult([], None if traj is None else [traj], reason, value)


# ----------------------------------------------------------------------------- verl's math


def test_advantages_are_verls_grpo() -> None:
    trajs = [_traj(3, [("model", 4), ("context", 2), ("model", 3)], s) for s in range(6)]
    batch = algo.pack(trajs)
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    groups = ["a", "a", "a", "b", "b", "b"]
    ours = algo.compute_advantages("grpo", rewards, batch.response_mask, groups)
    token_rewards = algo.outcome_rewards(rewards, batch.response_mask)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_rewards,
        response_mask=batch.response_mask,
        index=np.array(groups, dtype=object),
    )
    assert torch.equal(ours, theirs * batch.response_mask)
    assert ours[0].abs().sum() > 0 and ours[3].abs().sum() == 0  # group b has no spread
    # the outcome reward sits on the last model token, never on context or padding
    assert token_rewards[0].nonzero().flatten().tolist() == [8]
    # Dr.GRPO and other estimators are reached by name too
    drgrpo = algo.compute_advantages(
        "grpo", rewards, batch.response_mask, groups, norm_adv_by_std_in_grpo=False
    )
    assert torch.allclose(drgrpo[0, 0], torch.tensor(1 - 1 / 3))
    rloo = algo.compute_advantages("rloo", rewards, batch.response_mask, groups)
    assert torch.allclose(rloo[0, 0], torch.tensor(1.0))


@pytest.mark.parametrize(
    ("loss_mode", "agg"),
    [("vanilla", "token-mean"), ("gspo", "seq-mean-token-mean"), ("vanilla", "token-sum")],
)
def test_policy_loss_is_verls_and_micro_batches_add_up(loss_mode: str, agg: str) -> None:
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(6, 7, generator=g) > 0.3).float()
    old = -torch.rand(6, 7, generator=g)
    new = old + 0.3 * torch.randn(6, 7, generator=g)
    adv = torch.randn(6, 1, generator=g).expand(6, 7) * mask
    cfg = algo.actor_config(loss_mode, 0.2, 0.28, 3.0, int(mask.sum()), 6)
    ours, metrics = algo.policy_loss(loss_mode, old, new, adv, mask, agg, cfg)
    fn = (
        core_algos.compute_policy_loss_gspo if loss_mode == "gspo" else core_algos.compute_policy_loss_vanilla
    )
    theirs, their_metrics = fn(old, new, adv, mask, loss_agg_mode=agg, config=cfg)
    assert torch.equal(ours, theirs) and metrics == their_metrics
    micro = sum(
        algo.policy_loss(
            loss_mode, old[i : i + 2], new[i : i + 2], adv[i : i + 2], mask[i : i + 2], agg, cfg
        )[0]
        for i in range(0, 6, 2)
    )
    assert torch.allclose(micro, ours, atol=1e-6)


def test_kl_loss_is_verls() -> None:
    g = torch.Generator().manual_seed(2)
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    lp, ref = -torch.rand(3, 5, generator=g), -torch.rand(3, 5, generator=g)
    cfg = algo.actor_config("vanilla", 0.2, 0.2, 3.0, int(mask.sum()), 3)
    ours = algo.kl_loss(lp, ref, mask, "low_var_kl", "token-mean", cfg)
    theirs = core_algos.agg_loss(core_algos.kl_penalty(lp, ref, "low_var_kl"), mask, "token-mean")
    assert torch.allclose(ours, theirs)


def test_mismatch_metrics_on_a_crafted_batch() -> None:
    """Known rollout vs recompute logprobs: the gap (mean and max of |rollout - recompute|) and verl's
    mismatch statistics count model tokens only; context tokens and padding with huge gaps do not."""
    rollout = torch.tensor([[-1.0, -2.0, -0.5, -9.0, -1.0], [-0.2, -0.3, 0.0, 0.0, 0.0]])
    recompute = torch.tensor([[-1.1, -2.0, -1.5, 0.0, -1.4], [-0.2, -0.1, -7.0, -7.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0]])  # [0, 3]: a tool result
    m = mismatch.mismatch_metrics(recompute, rollout, mask)
    gaps = [0.1, 0.0, 1.0, 0.4, 0.0, 0.2]
    assert m["training/rollout_logprob_diff_mean"] == pytest.approx(sum(gaps) / 6)
    assert m["training/rollout_logprob_diff_max"] == pytest.approx(1.0)
    log_ratio = (recompute - rollout)[mask.bool()]
    assert m["rollout_corr/k3_kl"] == pytest.approx(float((log_ratio.exp() - log_ratio - 1).mean()))
    assert m["rollout_corr/kl"] == pytest.approx(float(-log_ratio.mean()))
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(float(torch.tensor(0.2).exp()))  # row 1, token 1
    assert m["training/rollout_probs_diff_valid"] == 1.0
    assert all(isinstance(v, float) for v in m.values())
    same = mismatch.mismatch_metrics(rollout, rollout, mask)
    assert same["training/rollout_logprob_diff_max"] == 0.0 and same["rollout_corr/k3_kl"] == 0.0


def test_tis_weights_are_truncated_and_scale_the_policy_loss() -> None:
    """verl's token-level TIS: weight = min(pi_trainer / pi_rollout, threshold), zero off the mask,
    multiplied into the per-token loss by verl's own policy loss (a token whose ratio is above the
    threshold gets exactly `threshold` times its unweighted gradient)."""
    rollout = torch.tensor([[-2.0, -1.0, -1.0, -1.0]])
    recompute = torch.tensor([[-1.0, -1.0, -1.5, -1.0]])  # ratios e, 1, e^-0.5, (context)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = mismatch.is_weights(recompute, rollout, mask, "token", 2.0)
    assert w.tolist()[0] == pytest.approx([2.0, 1.0, float(torch.tensor(-0.5).exp()), 0.0])
    assert not w.requires_grad
    icepop = mismatch.is_weights(recompute, rollout, mask, "token", "0.7_2.0")
    assert icepop.tolist()[0] == pytest.approx([0.0, 1.0, 0.0, 0.0])  # outside [0.7, 2]: dropped
    seq = mismatch.is_weights(recompute, rollout, mask, "sequence", 10.0)
    assert seq[0, :3].tolist() == pytest.approx([float(torch.tensor(0.5).exp())] * 3)

    adv = torch.ones(1, 4) * mask
    cfg = algo.actor_config("vanilla", 0.2, 0.28, 3.0, int(mask.sum()), 1)
    grads = []
    for weights in (None, w):
        logp = recompute.clone().requires_grad_(True)
        loss, _ = algo.policy_loss("vanilla", logp.detach(), logp, adv, mask, "token-mean", cfg, weights)
        theirs, _ = core_algos.compute_policy_loss_vanilla(
            logp.detach(), logp, adv, mask, loss_agg_mode="token-mean", config=cfg, rollout_is_weights=weights
        )
        assert torch.equal(loss, theirs)
        loss.backward()
        grads.append(logp.grad)
    assert torch.allclose(grads[1], grads[0] * w)
    assert grads[1][0, 0] == pytest.approx(2.0 * grads[0][0, 0])  # clipped at the threshold


def test_context_tokens_get_no_gradient() -> None:
    traj = _traj(4, [("model", 3), ("context", 5), ("model", 2)])
    batch = algo.pack([traj, _traj(2, [("model", 6)], 1)])
    logp = batch.old_log_probs.clone().requires_grad_(True)
    adv = algo.compute_advantages("grpo", [1.0, 0.0], batch.response_mask, ["x", "x"])
    cfg = algo.actor_config("vanilla", 0.2, 0.2, 3.0, int(batch.response_mask.sum()), 2)
    loss, _ = algo.policy_loss(
        "vanilla", batch.old_log_probs, logp, adv, batch.response_mask, "token-mean", cfg
    )
    loss.backward()
    grad = logp.grad
    assert grad[0, 3:8].abs().sum() == 0  # the tool-result tokens
    assert grad[0, 10:].abs().sum() == 0  # padding
    assert (grad[0, :3] != 0).all() and (grad[0, 8:10] != 0).all()


def test_teacher_forced_logprobs_match_the_engine(smol_source) -> None:
    """Old logprobs (the engine's, batched with a KV cache) and a teacher-forced pass agree."""
    from uniagent.models.loading import load_causal_lm
    from uniagent.models.local import LocalEngine

    model = load_causal_lm(smol_source)
    with LocalEngine.from_model(model) as engine:
        gen = asyncio.run(
            engine.generate([1, 9690, 28, 940], SamplingParams(temperature=0, max_tokens=6), "r")
        )
    traj = Trajectory(prompt_ids=[1, 9690, 28, 940])
    traj.add_generation(gen.token_ids, gen.logprobs)
    batch = algo.pack([traj])
    with torch.no_grad():
        logp = algo.response_log_probs(model, batch)
    assert torch.allclose(logp, batch.old_log_probs, atol=1e-3)
    # the same recompute for any (prompt, response) pair, e.g. tokens another server generated
    pairs = [([1, 9690, 28, 940], gen.token_ids), ([1, 9690], gen.token_ids[:2])]
    again = mismatch.recompute_log_probs(model, pairs, micro_batch_size=1)
    assert [len(r) for r in again] == [len(gen.token_ids), 2]
    assert again[0] == pytest.approx(gen.logprobs, abs=1e-3)


# ----------------------------------------------------------------------------- the trainer


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from uniagent.train.local import LocalTrainer

    out = tmp_path_factory.mktemp("train")
    cfg = build_train_config(
        None,
        [
            f"trainer.output={out}",
            "tasks.limit=4",
            "trainer.group_size=2",
            "trainer.tasks_per_step=2",
            "model.max_tokens=24",
            "optim.lr=1e-4",
            "trainer.tensorboard=false",
            "model.dtype=float32",  # the engine serves the policy itself: exact, shared weights
        ],
    )
    t = LocalTrainer(cfg)
    yield t
    t.close()


def test_untrainable_episodes_are_excluded(trainer, monkeypatch) -> None:
    from uniagent.train.sample import Sample

    task = load_toy_tasks(limit=1)[0]
    seen: list[list[Trajectory]] = []
    real_pack = algo.pack
    monkeypatch.setattr(algo, "pack", lambda trajs, *a: seen.append(trajs) or real_pack(trajs, *a))
    good = [_traj(5, [("model", 4)], s) for s in range(2)]
    dead = _traj(5, [("model", 50)], 9)
    samples = [
        Sample(task, "g", _episode(good[0], 1.0, ExitReason.FINISHED)),
        Sample(task, "g", _episode(good[1], 0.0, ExitReason.FORMAT_ERRORS)),
        Sample(task, "g", _episode(dead, None, ExitReason.SANDBOX_DEAD)),
        Sample(task, "g", _episode(dead, 0.0, ExitReason.MODEL_ERROR)),
    ]
    metrics = trainer.update(samples)
    assert metrics["episodes_trained"] == 2
    assert seen == [good]


def test_update_is_seen_by_the_next_generation(trainer, monkeypatch) -> None:
    """The engine serves the trainer's parameters: one optimizer step changes its logprobs. The update
    hands back its OpenMP threads when done (they would throttle the engine's; uniagent.cpu)."""
    import uniagent.train.local as train_local
    from uniagent.models import linear

    # the shared policy's linears take the laid-out product where the probe picked it for fp32
    layers = [m for m in trainer.policy.modules() if isinstance(m, torch.nn.Linear)]
    assert all(isinstance(m, linear.PackedLinear) for m in layers) == linear.choice(torch.float32).packed
    released: list[bool] = []
    monkeypatch.setattr(train_local, "release_openmp_team", lambda: released.append(True) or True)
    assert trainer.engine.model is trainer.policy
    prompt = trainer.codec.prompt_ids(
        ToyTask.from_row({"id": "x", "question": "What is 2 + 3?", "answer": 5}).messages()
    )
    greedy = SamplingParams(temperature=0, max_tokens=4)

    async def gen():
        return await trainer.engine.generate(prompt, greedy, "probe")

    before = asyncio.run(gen())
    traj = Trajectory(prompt_ids=prompt)
    traj.add_generation(before.token_ids, before.logprobs)
    other = Trajectory(prompt_ids=prompt)
    other.add_generation(before.token_ids[:2], before.logprobs[:2])
    from uniagent.train.sample import Sample

    task = load_toy_tasks(limit=1)[0]
    trainer.update(
        [
            Sample(task, "g", _episode(traj, 0.0, ExitReason.FINISHED)),
            Sample(task, "g", _episode(other, 1.0, ExitReason.FINISHED)),
        ]
    )
    assert released == [True]
    after = asyncio.run(gen())
    for layer in layers:  # the optimizer wrote every weight; the engine laid out again what it ran
        if isinstance(layer, linear.PackedLinear):
            fresh = layer._packed_key == (layer.weight._version, layer.weight.data_ptr())
            assert fresh or layer._native_path  # the native product (few rows) reads the dense weight
    assert after.token_ids[:1] != before.token_ids[:1] or after.logprobs[0] != pytest.approx(
        before.logprobs[0]
    )


@pytest.mark.parametrize("rollout_is", [None, "token"])
def test_update_reports_the_gap_and_applies_tis_when_asked(trainer, monkeypatch, rollout_is) -> None:
    """The step's gap metrics are those of the trainer's recompute against the engine's logprobs (made
    up here, so the gap is large); with `rollout_is` set, verl's decoupled mode: the loss ratio is
    against the recompute and verl's truncated weights of recompute vs rollout reach the loss."""
    from uniagent.train.sample import Sample

    corr = {"rollout_is": rollout_is, "rollout_is_threshold": 1.5}
    algo_cfg = trainer.cfg.algo.model_copy(
        update={"rollout_correction": trainer.cfg.algo.rollout_correction.model_validate(corr)}
    )
    monkeypatch.setattr(trainer, "cfg", trainer.cfg.model_copy(update={"algo": algo_cfg}))
    task = load_toy_tasks(limit=1)[0]
    trajs = [_traj(5, [("model", 3), ("context", 2), ("model", 2)], s) for s in range(2)]
    trajs[0].response_logprobs[0] = -60.0  # a token the "engine" found far less likely: ratio >> 1.5
    batch = algo.pack(trajs)
    with torch.no_grad():
        recompute = algo.response_log_probs(trainer.policy, batch)
    expected = mismatch.mismatch_metrics(recompute, batch.old_log_probs, batch.response_mask, "token", 1.5)
    calls: list[tuple] = []
    real_loss = algo.policy_loss
    monkeypatch.setattr(algo, "policy_loss", lambda *a: calls.append(a) or real_loss(*a))
    metrics = trainer.update(
        [Sample(task, "g", _episode(t, float(i), ExitReason.FINISHED)) for i, t in enumerate(trajs)]
    )
    for key in (
        "training/rollout_logprob_diff_mean",
        "training/rollout_logprob_diff_max",
        "rollout_corr/k3_kl",
    ):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-5), key
    assert metrics["training/rollout_logprob_diff_max"] > 1.0  # made-up engine logprobs vs SmolLM2's
    ((_mode, old, logp, _adv, mask, _agg, _cfg, weights),) = calls  # one micro-batch
    if rollout_is is None:  # verl's bypass: the ratio is against the engine's logprobs, no weights
        assert weights is None and torch.equal(old, batch.old_log_probs)
    else:
        assert torch.equal(old, logp.detach())
        ratio = (old - batch.old_log_probs).exp() * mask
        assert torch.allclose(weights, ratio.clamp(max=1.5), atol=1e-5)
        assert weights.max() == pytest.approx(1.5) and (weights * (1 - mask)).abs().sum() == 0


def test_checkpoint_and_resume_restore_step_and_optimizer(trainer) -> None:
    from uniagent.train.local import LocalTrainer
    from uniagent.train.sample import Sample

    task = load_toy_tasks(limit=1)[0]
    trajs = [_traj(5, [("model", 4)], s) for s in range(2)]
    trainer.update(
        [Sample(task, "g", _episode(t, float(i), ExitReason.FINISHED)) for i, t in enumerate(trajs)]
    )
    trainer.step = 3
    trainer.rng.random()
    path = trainer.save()
    assert path.name == "step_000003.pt"
    with pytest.raises(ConfigError, match="--resume"):
        LocalTrainer(trainer.cfg)
    resumed = LocalTrainer(trainer.cfg, resume=True)
    try:
        assert resumed.step == 3
        assert resumed.rng.random() == trainer.rng.random()
        a, b = trainer.optimizer.state_dict(), resumed.optimizer.state_dict()
        assert a["state"].keys() == b["state"].keys() and a["state"]
        for key in a["state"]:
            assert torch.equal(a["state"][key]["exp_avg"], b["state"][key]["exp_avg"])
        for (name, p), q in zip(trainer.policy.named_parameters(), resumed.policy.parameters(), strict=True):
            assert torch.equal(p, q), name
    finally:
        resumed.close()


def test_step_with_too_many_infra_failures_stops_training(trainer, monkeypatch) -> None:
    """After the rollouts, a step whose episodes are mostly infrastructure failures raises
    TrainingError (counts per exit reason, the setting) and never reaches the update; one at or under
    trainer.max_infra_failure_share trains on its trainable episodes. Episode results are made up
    here: the rollout machinery is not what is tested."""
    from uniagent.errors import TrainingError
    from uniagent.train.local import METRICS
    from uniagent.train.sample import Sample

    task = load_toy_tasks(limit=1)[0]
    good = [_traj(5, [("model", 4)], s) for s in range(2)]

    def failed(reason: ExitReason) -> EpisodeResult:
        return EpisodeResult([], None, reason, None, error=f"{reason.value}: scripted\ndetails")

    def step_with(results: list[EpisodeResult]) -> dict:
        async def rollout(tasks, batch=0):
            return [Sample(task, "g", r) for r in results]

        monkeypatch.setattr(trainer, "rollout", rollout)
        return asyncio.run(trainer.train_step())

    updates: list[int] = []
    real_update = trainer.update
    monkeypatch.setattr(
        trainer, "update", lambda samples: updates.append(len(samples)) or real_update(samples)
    )
    rows_before = (trainer.out / METRICS).read_text().count("\n") if (trainer.out / METRICS).exists() else 0
    step = trainer.step
    bad = [
        _episode(good[0], 1.0, ExitReason.FINISHED),
        failed(ExitReason.INTERNAL_ERROR),
        failed(ExitReason.INTERNAL_ERROR),
        failed(ExitReason.SANDBOX_DEAD),
    ]
    with pytest.raises(TrainingError) as info:
        step_with(bad)
    message = str(info.value)
    assert f"step {step + 1}: 3 of 4 episodes are infrastructure failures" in message
    assert "internal_error 2, sandbox_dead 1" in message and "trainer.max_infra_failure_share=0.5" in message
    assert "first error: internal_error: scripted" in message and "\n" not in message
    assert updates == [] and trainer.step == step
    assert (
        (trainer.out / METRICS).read_text().count("\n") if (trainer.out / METRICS).exists() else 0
    ) == rows_before

    ok = [
        _episode(good[0], 1.0, ExitReason.FINISHED),
        _episode(good[1], 0.0, ExitReason.MAX_TURNS),
        failed(ExitReason.MODEL_ERROR),
        failed(ExitReason.VERIFIER_ERROR),
    ]
    row = step_with(ok)
    assert updates == [4] and row["episodes_trained"] == 2 and row["untrainable"] == 2
    assert trainer.step == step + 1


def test_episode_that_echoes_a_secret_is_redacted_and_not_trained_on(trainer, monkeypatch) -> None:
    """A secret in the environment and in the sandbox settings; the (replayed) policy writes it. The
    step's episodes come back with no id decoding to it, not trainable (secret_redacted), so the
    update trains on none of them; the checkpoint's config snapshot and metrics.jsonl hold neither
    secret. The rollout, sandbox, verifier and update are the real ones; only the model's words are
    scripted (a 135M model does not echo keys on demand)."""
    from agent_helpers import call
    from uniagent.models.base import Generation
    from uniagent.models.replay import ReplayEngine, ReplayRecord
    from uniagent.train.local import METRICS

    secret, token = "sk-uniagent-train-0a1b2c3d4e5f", "hf_uniagent_sandbox_77aa88bb"
    monkeypatch.setenv("UNIAGENT_TEST_API_KEY", secret)
    from uniagent.sandbox.config import parse_config

    sandbox = parse_config({"type": "local", "env": {"HF_TOKEN": token}})  # typed, as a load makes it
    cfg = trainer.cfg.model_copy(update={"sandbox": sandbox})
    monkeypatch.setattr(trainer, "cfg", cfg)
    task = load_toy_tasks(limit=1)[0]
    text = f"Using {secret} and {token}. " + call("finish", answer=task.answer)
    ids = trainer.codec.encode(text) + trainer.codec.eot_ids

    def replay() -> ReplayEngine:  # the policy's turn, for each sample of the step (prompts unrecorded)
        gen = Generation(ids, [-0.5] * len(ids), "stop")
        rids = [f"{task.instance_id}#{trainer.step}#{k}" for k in range(cfg.trainer.group_size)]
        return ReplayEngine([ReplayRecord(r, gen, 0, None, "0" * 64) for r in rids], strict=False)

    engine = trainer.engine
    monkeypatch.setattr(trainer, "engine", replay())
    samples = asyncio.run(trainer.rollout([task]))
    assert len(samples) == cfg.trainer.group_size
    tok = trainer.codec.tokenizer
    for s in samples:
        r = s.result
        assert r.exit_reason is ExitReason.FINISHED and r.resolved, "a good episode otherwise"
        assert not r.trainable and r.metrics["untrainable_reason"] == "secret_redacted"
        t = r.trajectory
        for seq in (t.prompt_ids + t.response_ids, t.response_ids):
            for skip in (False, True):
                decoded = tok.decode(seq, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
                assert secret not in decoded and token not in decoded
        assert "[REDACTED]" in tok.decode(t.response_ids)
        assert secret not in json.dumps(r.to_dict()) and token not in json.dumps(r.to_dict())
    assert trainer.update(samples)["episodes_trained"] == 0

    async def rollout(tasks, batch=0):  # the same samples through a whole step (the real engine's)
        return samples

    monkeypatch.setattr(trainer, "engine", engine)
    monkeypatch.setattr(trainer, "rollout", rollout)
    row = asyncio.run(trainer.train_step())
    assert row["untrainable"] == row["episodes"] == cfg.trainer.group_size and row["episodes_trained"] == 0
    state = torch.load(trainer.save(), weights_only=False)
    stored = json.dumps(state["config"]) + (trainer.out / METRICS).read_text()
    assert state["config"]["sandbox"]["env"]["HF_TOKEN"] == "[REDACTED]"
    assert secret not in stored and token not in stored


# ----------------------------------------------------------------------------- config and CLI


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.parser=hermez", "model.parser"),
        ("algo.adv_estimator=grop", "algo.adv_estimator"),
        ("algo.loss_mode=vanila", "algo.loss_mode"),
        ("algo.kl_loss_type=k9", "algo.kl_loss_type"),
        ("trainer.max_infra_failure_share=1.5", "trainer.max_infra_failure_share"),
    ],
)
def test_names_verl_resolves_late_are_checked_at_start(override: str, key: str) -> None:
    """Settings the old trainer met only at the first update (verl's registries) or at the first
    rollout (the parser) are one ConfigError naming the key when the config is built."""
    with pytest.raises(ConfigError, match=rf"^config {key}: ") as info:
        build_train_config(None, [override])
    assert "\n" not in str(info.value)


def test_names_verl_knows_are_accepted() -> None:
    cfg = build_train_config(
        None, ["algo.adv_estimator=rloo", "algo.loss_mode=gspo", "algo.kl_loss_type=k3+", "model.parser=xml"]
    )
    assert (cfg.algo.adv_estimator, cfg.algo.loss_mode, cfg.algo.kl_loss_type) == ("rloo", "gspo", "k3+")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["algo.rollout_correction.rollout_is=tis"], "algo.rollout_correction.rollout_is"),
        (["algo.rollout_correction.rollout_is_threshold=0"], "algo.rollout_correction.rollout_is_threshold"),
        (
            ["algo.rollout_correction.rollout_is_threshold=yes"],
            "algo.rollout_correction.rollout_is_threshold",
        ),
        (
            [
                "algo.rollout_correction.rollout_is_threshold=2",
                "algo.rollout_correction.rollout_is_threshold_lower=3",
            ],
            "algo.rollout_correction",
        ),
        (["algo.rollout_correction.rollout_rs=token_k1"], "algo.rollout_correction.rollout_rs"),
    ],
)
def test_rollout_correction_settings_are_validated(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^config {key}: "):
        build_train_config(None, overrides)


def test_rollout_correction_is_off_by_default_and_maps_to_verls_threshold() -> None:
    corr = build_train_config(None, []).algo.rollout_correction
    assert corr.rollout_is is None and corr.threshold_spec == 2.0
    on = build_train_config(
        None,
        [
            "algo.rollout_correction.rollout_is=token",
            "algo.rollout_correction.rollout_is_threshold=5",
            "algo.rollout_correction.rollout_is_threshold_lower=0.5",
        ],
    ).algo.rollout_correction
    assert on.rollout_is == "token" and on.threshold_spec == "0.5_5.0"  # verl's IcePop spelling


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"algo\.lossmode"):
        build_train_config(None, ["algo.lossmode=gspo"])
    cfg = build_train_config(Path("configs/train_local.yaml"), ["algo.loss_mode=gspo"])
    assert cfg.algo.loss_mode == "gspo" and cfg.tasks.spec == "toy"


def test_cli_short_run_writes_metrics_curve_and_checkpoint(tmp_path: Path) -> None:
    from uniagent.cli import app

    out = tmp_path / "run"
    args = [
        "train", "--engine", "local", "--config", "configs/train_local.yaml",
        "--set", f"trainer.output={out}", "--set", "trainer.steps=2", "--set", "trainer.save_every=1",
        "--set", "trainer.group_size=2", "--set", "trainer.tasks_per_step=1", "--set", "model.max_tokens=12",
        "--set", "model.dtype=float32",  # the engine serves the policy itself (checked below)
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward_mean",
        "resolved_rate",
        "loss",
        "pg_clipfrac",
        "ppo_kl",
        "rollout_tokens_per_s",
        "step_s",
        "training/rollout_logprob_diff_mean",
        "training/rollout_logprob_diff_max",
        "rollout_corr/k3_kl",
        "rollout_corr/rollout_is_mean",
    ):
        assert key in rows[0], key
    # the engine serves the trainer's own weights: rollout vs recompute is float noise
    assert rows[0]["training/rollout_logprob_diff_max"] < 1e-2
    assert rows[0]["episodes"] == 2
    assert (out / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in (out / "checkpoints").glob("*.pt")] == ["step_000002.pt"]
    again = CliRunner().invoke(app, args)
    assert again.exit_code != 0 and "--resume" in str(again.exception)


def test_cli_verl_engine_without_the_integration_says_so(monkeypatch) -> None:
    import builtins

    from uniagent.cli import app
    from uniagent.errors import UniAgentError

    real_import = builtins.__import__

    def no_verl(name, *args, **kwargs):
        if name.startswith("uniagent.integrations.verl"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_verl)
    result = CliRunner().invoke(app, ["train", "--engine", "verl", "--config", "x.yaml", "--print"])
    assert isinstance(result.exception, UniAgentError)
    assert "integrations.verl.launch" in str(result.exception)


def test_cli_verl_engine_print_is_the_launch_command() -> None:
    launch = require_module("uniagent.integrations.verl.launch", "the verl integration")
    from uniagent.cli import app

    result = CliRunner().invoke(
        app,
        [
            "train",
            "--engine",
            "verl",
            "--config",
            "starter_grpo",
            "--print",
            "--set",
            "trainer.total_epochs=1",
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    expected = launch.shell_line("starter_grpo", ["trainer.total_epochs=1"])  # its environment in front
    assert result.output.strip() == expected
    assert expected.endswith(shlex.join(launch.build_command("starter_grpo", ["trainer.total_epochs=1"])))


# ----------------------------------------------------------------------------- segments


def _segmented(trajs: list[Trajectory], reward: float) -> EpisodeResult:
    """An episode whose token record is `trajs` (several segments: its history was condensed or
    rewritten; what made them is not what is tested here)."""
    return EpisodeResult([], trajs, ExitReason.FINISHED, Reward(reward, reward == 1.0))


def _two_segments(seed: int = 0) -> list[Trajectory]:
    """A condensed episode: the second segment's prompt holds the first one's generated tokens as
    context, plus an empty third segment (opened, then the episode ended before a model turn)."""
    first = _traj(4, [("model", 3), ("context", 2), ("model", 2)], seed)
    second = _traj(0, [("model", 4), ("context", 1), ("model", 1)], seed + 100)
    second.prompt_ids = first.prompt_ids[:2] + first.response_ids[:3] + [7, 8]
    second.reason = "condensed"
    empty = Trajectory(prompt_ids=[5, 6, 7], reason="condensed")
    return [first, second, empty]


@pytest.mark.parametrize(
    ("estimator", "norm"),
    [("grpo", True), ("grpo", False), ("rloo", True), ("opo", True), ("grpo_vectorized", True)],
)
def test_single_segment_episodes_train_exactly_as_before(estimator: str, norm: bool) -> None:
    """Episodes of one segment: the rows are the episodes' trajectories and the advantages are the
    estimator's over them, bit for bit what the trainer computed before segments existed."""
    from uniagent.train import segments

    trajs = [_traj(3, [("model", 2 + s), ("context", 2), ("model", 3)], s) for s in range(6)]
    rewards, groups = [1.0, 0.0, 0.5, 1.0, 1.0, 0.0], ["a", "a", "a", "b", "b", "b"]
    rows = segments.segment_rows([_segmented([t], r) for t, r in zip(trajs, rewards, strict=True)])
    assert rows.trajectories == trajs and rows.final == list(range(6))
    batch = algo.pack(trajs)
    before = algo.compute_advantages(estimator, rewards, batch.response_mask, groups, norm)
    after = segments.episode_advantages(estimator, rows, rewards, groups, batch.response_mask, norm)
    assert torch.equal(after, before)


def test_two_segment_episode_trains_both_segments_with_the_episode_advantage(trainer, monkeypatch) -> None:
    """A two-segment episode (reward 1) and a one-segment sibling (reward 0) in one GRPO group: the
    step packs three rows with the segments' own masks; both segments carry the episode's advantage,
    the one verl's GRPO gives the episode in a group of two episodes (not of three rows)."""
    from uniagent.train import segments
    from uniagent.train.sample import Sample

    task = load_toy_tasks(limit=1)[0]
    segs, other = _two_segments(), _traj(5, [("model", 5)], 9)
    packed: list[list[Trajectory]] = []
    advantages: list[torch.Tensor] = []
    real_pack, real_adv = algo.pack, segments.episode_advantages
    monkeypatch.setattr(algo, "pack", lambda trajs, *a: packed.append(trajs) or real_pack(trajs, *a))
    monkeypatch.setattr(
        segments, "episode_advantages", lambda *a: advantages.append(real_adv(*a)) or advantages[-1]
    )
    metrics = trainer.update(
        [
            Sample(task, "g", _segmented(segs, 1.0)),
            Sample(task, "g", _segmented([other], 0.0)),
        ]
    )
    assert metrics["episodes_trained"] == 2 and metrics["segments_trained"] == 3
    assert packed == [[segs[0], segs[1], other]]  # the empty segment trains nothing and is left out
    batch = real_pack(packed[0])
    for i, t in enumerate(packed[0]):  # each row's mask is its segment's own
        n = len(t.response_mask)
        assert batch.response_mask[i, :n].tolist() == t.response_mask
        assert batch.response_mask[i, n:].sum() == 0
    (adv,) = advantages
    two = algo.pack([segs[1], other])  # verl's GRPO over the two episodes' final segments
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=algo.outcome_rewards([1.0, 0.0], two.response_mask),
        response_mask=two.response_mask,
        index=np.array(["g", "g"], dtype=object),
    )
    a = float(theirs[0, 0])
    assert a > 0 and float(theirs[1, 0]) == pytest.approx(-a)
    assert torch.equal(adv[0], a * batch.response_mask[0])
    assert torch.equal(adv[1], a * batch.response_mask[1])
    assert torch.allclose(adv[2], -a * batch.response_mask[2])


@pytest.mark.parametrize(("loss_mode", "agg"), [("vanilla", "token-mean"), ("gspo", "seq-mean-token-mean")])
def test_segment_context_gets_no_gradient_and_gspo_ratio_is_per_segment(loss_mode: str, agg: str) -> None:
    """Mask-0 tokens of every segment get no gradient. GSPO's sequence ratio is the segment's own:
    moving the first segment's logprobs leaves the second segment's gradient as it was."""
    from uniagent.train import segments

    segs = _two_segments(3)
    rows = segments.segment_rows([_segmented(segs, 1.0), _segmented([_traj(2, [("model", 4)], 4)], 0.0)])
    batch = algo.pack(rows.trajectories)
    mask = batch.response_mask
    adv = segments.episode_advantages("grpo", rows, [1.0, 0.0], ["x", "x"], mask)
    cfg = algo.actor_config(loss_mode, 0.2, 0.28, 3.0, int(mask.sum()), len(batch))

    def grads(shift_first: float) -> torch.Tensor:
        logp = batch.old_log_probs.clone()
        logp[0] += shift_first * mask[0]  # the first segment's model tokens only
        logp.requires_grad_(True)
        loss, _ = algo.policy_loss(loss_mode, batch.old_log_probs, logp, adv, mask, agg, cfg)
        loss.backward()
        return logp.grad

    g = grads(0.0)
    assert (g * (1 - mask)).abs().sum() == 0  # context (and padding) of every row
    assert (g[mask > 0] != 0).all()  # every model token of both segments learns
    moved = grads(0.1)  # segment 1's ratio exp(0.1): still inside the clip range for a > 0
    assert not torch.allclose(moved[0], g[0]) if loss_mode == "gspo" else True
    assert torch.equal(moved[1], g[1]) and torch.equal(moved[2], g[2])


def test_segment_advantages_match_verls_multi_output_trainer() -> None:
    """verl 0.9's V1 trainer trains a multi-output agent loop with
    `compute_advantage_for_multi_trajectories` (rows keyed `{uid}_{session}_{index}`): GRPO on each
    session's final output, broadcast to the session's rows. Ours gives the same numbers."""
    v1 = require_module(
        "verl.trainer.ppo.v1.utils", "verl's V1 trainer (TransferQueue: pip install -e .[verl])"
    )
    from verl.protocol import DataProto

    from uniagent.train import segments

    episodes = [
        (_two_segments(0)[:2], 1.0, "u1", 0),
        ([_traj(3, [("model", 4)], 5)], 0.0, "u1", 1),
        ([_traj(3, [("model", 2), ("context", 1), ("model", 2)], 6)], 0.0, "u2", 0),
        (_two_segments(7)[:2], 1.0, "u2", 1),
        ([_traj(2, [("model", 3)], 8)], 1.0, "u2", 2),
    ]
    rows = segments.segment_rows([_segmented(t, r) for t, r, _, _ in episodes])
    rewards, groups = [r for _, r, _, _ in episodes], [u for _, _, u, _ in episodes]
    batch = algo.pack(rows.trajectories)
    ours = segments.episode_advantages("grpo", rows, rewards, groups, batch.response_mask)
    keys = [f"{u}_{s}_{i}" for trajs, _, u, s in episodes for i in range(len(trajs))]
    row_rewards = [rewards[k] for k in rows.episode]  # verl puts the score on every output
    data = DataProto.from_dict(
        tensors={
            "response_mask": batch.response_mask,
            "token_level_rewards": algo.outcome_rewards(row_rewards, batch.response_mask),
        },
        non_tensors={"uid": np.array([k.split("_")[0] for k in keys], dtype=object)},
    )
    theirs = v1.compute_advantage_for_multi_trajectories(data, keys, "grpo").batch["advantages"]
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_multi_segment_episode_needs_one_advantage_per_episode(monkeypatch) -> None:
    """An estimator whose advantages vary along a row cannot be broadcast to an episode's segments:
    one line says so. (None of verl's estimators that run without a critic or extra inputs varies;
    the estimator's output is replaced here to reach the check.)"""
    from uniagent.errors import TrainingError
    from uniagent.train import segments

    rows = segments.segment_rows([_segmented(_two_segments(), 1.0)])
    mask = algo.pack(rows.trajectories).response_mask
    ramp = torch.arange(mask.shape[1], dtype=torch.float32).expand(1, -1)
    monkeypatch.setattr(algo, "compute_advantages", lambda *a: ramp * a[2])
    with pytest.raises(TrainingError, match="adv_estimator=fancy gives advantages that vary"):
        segments.episode_advantages("fancy", rows, [1.0], ["g"], mask)
