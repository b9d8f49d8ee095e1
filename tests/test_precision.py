"""`model.dtype` (issue 28 part 3): `auto` picks by the CPU probe and says why; the local trainer keeps
fp32 master weights and optimizer state, computes bf16 under autocast, and its engine serves a bf16 copy
refreshed by every update; verl keeps fp32 under auto."""

from __future__ import annotations

import asyncio

import pytest
import torch

from uniagent import cpu
from uniagent.agent.result import EpisodeResult, ExitReason, Reward
from uniagent.errors import ConfigError
from uniagent.models import precision
from uniagent.models.base import SamplingParams
from uniagent.models.config import ModelConfig
from uniagent.tokens import Trajectory
from uniagent.train.config import build_train_config
from uniagent.train.toy import ToyTask, load_toy_tasks


def _choice(fp32: float, bf16: float) -> cpu.TorchChoice:
    return cpu.TorchChoice("default", {}, "AVX512", fp32, bf16)


@pytest.fixture
def probe(monkeypatch):
    """Set what the CPU probe measured; `auto`'s memo is cleared before and after."""

    def set_probe(fp32: float, bf16: float) -> None:
        precision._auto.cache_clear()
        monkeypatch.setattr(cpu, "torch_choice", lambda refresh=False: _choice(fp32, bf16))

    yield set_probe
    precision._auto.cache_clear()


def test_auto_picks_bf16_only_where_the_probe_measured_it_faster(probe) -> None:
    probe(100.0, 800.0)  # AMX: 8x
    got = precision.resolve("auto", "cpu")
    assert got.dtype == "bfloat16" and got.mixed and "8.0x" in got.why
    probe(100.0, 60.0)  # emulated bf16: slower than fp32
    got = precision.resolve("auto", "cpu")
    assert got.dtype == "float32" and not got.mixed and "under 1.5x" in got.why
    assert precision.resolve("float32", "cpu") == precision.Precision("float32", "set by model.dtype")


def test_model_dtype_is_auto_by_default_and_checked() -> None:
    assert ModelConfig().dtype == "auto"
    with pytest.raises(ValueError, match="one of auto, float32, bfloat16"):
        ModelConfig(dtype="float64")


def test_verl_keeps_fp32_parameters_under_auto() -> None:
    from uniagent.integrations.verl.keys import _dtype

    key = "actor_rollout_ref.actor.fsdp_config.model_dtype"
    assert _dtype(build_train_config(None, ["model.dtype=auto"]))[key] == "fp32"
    assert _dtype(build_train_config(None, ["model.dtype=bfloat16"]))[key] == "bf16"


def test_the_trainer_refuses_fp16(tmp_path) -> None:
    from uniagent.train.local import LocalTrainer

    cfg = build_train_config(None, [f"trainer.output={tmp_path}", "model.dtype=float16", "tasks.limit=2"])
    with pytest.raises(ConfigError, match="no loss scaler"):
        LocalTrainer(cfg)


def test_bf16_trainer_keeps_fp32_masters_and_its_engine_serves_the_update(tmp_path) -> None:
    from uniagent.train.local import LocalTrainer

    cfg = build_train_config(
        None,
        [f"trainer.output={tmp_path}", "model.dtype=bfloat16", "tasks.limit=2", "trainer.group_size=2",
         "model.max_tokens=8", "optim.lr=1e-3", "trainer.tensorboard=false"],
    )  # fmt: skip
    trainer = LocalTrainer(cfg)
    try:
        assert trainer.precision.dtype == "bfloat16" and not trainer.shared
        assert {p.dtype for p in trainer.policy.parameters()} == {torch.float32}
        assert {p.dtype for p in trainer.engine.model.parameters()} == {torch.bfloat16}
        assert trainer.engine.precision.dtype == "bfloat16"
        prompt = trainer.codec.prompt_ids(
            ToyTask.from_row({"id": "x", "question": "What is 2 + 3?", "answer": 5}).messages()
        )
        greedy = SamplingParams(temperature=0, max_tokens=4)
        gen = asyncio.run(trainer.engine.generate(prompt, greedy, "probe"))
        good, bad = Trajectory(prompt_ids=prompt), Trajectory(prompt_ids=prompt)
        good.add_generation(gen.token_ids, gen.logprobs)
        bad.add_generation(gen.token_ids[:2], gen.logprobs[:2])
        task = load_toy_tasks(limit=1)[0]
        from uniagent.train.sample import Sample

        before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
        metrics = trainer.update(
            [
                Sample(task, "g", EpisodeResult([], [good], ExitReason.FINISHED, Reward(1.0, True))),
                Sample(task, "g", EpisodeResult([], [bad], ExitReason.FINISHED, Reward(0.0, False))),
            ]
        )
        assert metrics["grad_norm"] > 0
        moved = [k for k, v in trainer.policy.state_dict().items() if not torch.equal(v, before[k])]
        assert moved, "the fp32 masters took the step"
        state = trainer.optimizer.state[next(trainer.policy.parameters())]
        assert state["exp_avg"].dtype == torch.float32
        # bf16 logprobs of an fp32 recompute's tokens: close, not equal (the mismatch IS corrects)
        gap = metrics["training/rollout_logprob_diff_max"]
        assert 0 < gap < 1.0, gap
        trainer.engine.update_weights(trainer.served_state(), 1).result(timeout=60)
        served = dict(trainer.engine.model.named_parameters())
        for name, param in trainer.policy.named_parameters():
            assert torch.equal(served[name], param.detach().to(torch.bfloat16)), name
        assert trainer.engine.version == 1
    finally:
        trainer.close()


def test_forward_work_counts_the_shared_prefix_once() -> None:
    from uniagent.train import algo

    prefix = list(range(100, 164))  # 64 shared tokens: above MIN_SHARED_PREFIX
    trajs = []
    for i in range(3):
        t = Trajectory(prompt_ids=[*prefix, 200 + i])
        t.add_generation([300 + i, 301 + i], [-1.0, -1.0])
        trajs.append(t)
    batch = algo.pack(trajs)
    layers, logits = algo.forward_work(batch)
    assert int(batch.attention_mask.sum()) == 3 * 67
    assert layers == 64 + 3 * 3  # the prefix once, then each row's own prompt token and response
    assert logits == 3 * 3  # from the last prompt token on
    assert algo.forward_work(batch, share_prefix=False)[0] == 3 * 67
