"""The update's shared-prefix forward (train/algo.py) gives the same logprobs and gradients as one
forward per row: a GRPO group's prompt runs once, every row on top of its repeated keys/values."""

from __future__ import annotations

import random

import pytest
import torch

from engine_helpers import tiny_llama
from uniagent.tokens import Trajectory
from uniagent.train import algo


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_llama(300, 512).float()


def _rows(prompts: list[list[int]], per_prompt: int, seed: int = 0) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for prompt in prompts:
        for _ in range(per_prompt):
            t = Trajectory(list(prompt))
            n = rng.randrange(5, 30)  # different lengths: right padding in the batch
            t.response_ids = [rng.randrange(3, 300) for _ in range(n)]
            t.response_mask = [1 if (i // 4) % 2 == 0 else 0 for i in range(n)]  # model / tool spans
            t.response_logprobs = [-1.0] * n
            out.append(t)
    return out


def _run(model: torch.nn.Module, batch: algo.Batch, share: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logp = algo.response_log_probs(model, batch, share_prefix=share)
    (logp * batch.response_mask).sum().backward()
    return logp.detach() * batch.response_mask, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "prompts",
    [
        [list(range(3, 3 + 60))],  # one group: its whole prompt is shared
        [list(range(3, 3 + 60)), [*range(3, 3 + 40), *range(100, 130)]],  # two tasks, one system prompt
        [list(range(3, 3 + 60)), list(range(3, 3 + 45))],  # one prompt is a prefix of the other
    ],
)
def test_shared_prefix_gives_the_same_logprobs_and_gradients(model, prompts) -> None:
    batch = algo.pack(_rows(prompts, 3))
    assert algo.shared_prefix_len(batch) >= algo.MIN_SHARED_PREFIX
    plain_logp, plain_grads = _run(model, batch, share=False)
    shared_logp, shared_grads = _run(model, batch, share=True)
    assert torch.allclose(shared_logp, plain_logp, atol=1e-5)
    for a, b in zip(shared_grads, plain_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_the_shared_part_stops_before_the_first_scored_position() -> None:
    short = list(range(3, 3 + 40))
    batch = algo.pack(_rows([short, [*short, 7, 8, 9]], 1))
    # every row shares the 40-token prompt, but row 0's first response token is scored from
    # position 39: the prefix run must leave that position to the rows' own forward
    assert algo.shared_prefix_len(batch) == 39


def test_nothing_is_shared_without_a_long_common_prefix() -> None:
    assert algo.shared_prefix_len(algo.pack(_rows([list(range(3, 63))], 1))) == 0  # one row
    different = [list(range(3, 63)), list(range(100, 160))]
    assert algo.shared_prefix_len(algo.pack(_rows(different, 2))) == 0
    few = [[*range(3, 13), *range(20, 70)], [*range(3, 13), *range(100, 150)]]  # 10 in common
    assert algo.shared_prefix_len(algo.pack(_rows(few, 2))) == 0


@pytest.mark.parametrize("share", [False, True])
def test_the_copy_free_gqa_attention_gives_the_update_the_same_numbers(model, share) -> None:
    """The trainer switches its policy to `uniagent_sdpa` (kv heads never repeated, the engine's too):
    logprobs and gradients are those of transformers' own sdpa, padded rows and shared prefix included."""
    import copy

    from uniagent.models.kv import ATTENTION, use_gqa_attention

    gqa = copy.deepcopy(model)
    use_gqa_attention(gqa)
    assert gqa.config._attn_implementation == ATTENTION and model.config._attn_implementation == "sdpa"
    batch = algo.pack(_rows([list(range(3, 3 + 60)), [*range(3, 3 + 40), *range(100, 130)]], 3))
    stock_logp, stock_grads = _run(model, batch, share=share)
    gqa_logp, gqa_grads = _run(gqa, batch, share=share)
    assert torch.allclose(gqa_logp, stock_logp, atol=1e-5)
    for a, b in zip(gqa_grads, stock_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
