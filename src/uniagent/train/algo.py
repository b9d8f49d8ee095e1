"""The RL math, delegated to verl's `core_algos`, plus the tensors it needs built from Trajectories.

Why delegate: the local trainer must optimise exactly what `verl` optimises on a cluster, so
switching `--engine local` for `--engine verl` changes the scale, never the objective. This
module only packs token data into verl's tensor layout (`[batch, response_len]`, mask 1 for
model tokens) and calls verl's advantage estimators, policy losses, `agg_loss` and `kl_penalty`.

Nothing here knows about episodes or engines, so the tests can compare it with direct calls.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from uniagent.tokens import Trajectory


@dataclass
class Batch:
    """Padded tensors for one training step.

    `input_ids`/`attention_mask` hold prompt + response, right-padded. Response token j of row i
    sits at position `prompt_len[i] + j`, so its logprob is read from logits at one position
    before. `response_mask` is the Trajectory mask (context tokens 0) with padding 0.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    old_log_probs: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, rows: slice) -> Batch:
        """A micro-batch, trimmed to its own longest sequence (less padding to run through the model)."""
        width = int(self.attention_mask[rows].sum(-1).max())
        resp = max(1, int((self.attention_mask[rows].sum(-1) - self.prompt_len[rows]).max()))
        return Batch(
            self.input_ids[rows, :width],
            self.attention_mask[rows, :width],
            self.prompt_len[rows],
            self.response_ids[rows, :resp],
            self.response_mask[rows, :resp],
            self.old_log_probs[rows, :resp],
        )

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on `device`: `pack` builds it on the CPU, the policy may sit on a GPU."""
        return Batch(*(getattr(self, f.name).to(device) for f in fields(self)))


def pack(trajectories: list[Trajectory], pad_id: int = 0) -> Batch:
    """Trajectories -> verl's layout. Old logprobs are the engine's (what the rollout sampled with)."""
    if not trajectories:
        raise ValueError("pack() needs at least one trajectory")
    width = max(len(t) for t in trajectories)
    resp = max(1, max(len(t.response_ids) for t in trajectories))
    n = len(trajectories)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response_ids = torch.full((n, resp), pad_id, dtype=torch.long)
    response_mask = torch.zeros((n, resp), dtype=torch.float32)
    old = torch.zeros((n, resp), dtype=torch.float32)
    prompt_len = torch.zeros(n, dtype=torch.long)
    for i, t in enumerate(trajectories):
        ids = t.token_ids
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        prompt_len[i] = len(t.prompt_ids)
        r = len(t.response_ids)
        if r:
            response_ids[i, :r] = torch.tensor(t.response_ids)
            response_mask[i, :r] = torch.tensor(t.response_mask, dtype=torch.float32)
            old[i, :r] = torch.tensor(t.response_logprobs, dtype=torch.float32)
    return Batch(input_ids, attention, prompt_len, response_ids, response_mask, old)


def response_log_probs(model: torch.nn.Module, batch: Batch, share_prefix: bool = True) -> torch.Tensor:
    """Teacher-forced logprobs of every response token, `[batch, response_len]`, fp32.

    One forward over prompt + response: the logits at position p predict the token at p + 1, so
    response token j of row i is scored at position `prompt_len[i] + j - 1`. Positions past a
    row's end are clamped and then zeroed by the caller's mask.
    """
    width = batch.input_ids.shape[1]
    # Only positions from the earliest response onwards need logits: skip the vocab projection
    # over the prompts (about a fifth of a small model's compute and most of its activation memory).
    keep = logit_positions(batch)
    shared = shared_prefix_len(batch) if share_prefix else 0
    if shared:
        # The rows' common prefix (a GRPO group's prompt, or the system prompt and tools every task
        # shares) runs once; its keys/values are repeated for every row and the rest runs on top.
        # Exact: the same positions, mask and weights, and the gradient through the repeated
        # keys/values sums into the one prefix forward. Padding sits at the right, after it.
        head = model(input_ids=batch.input_ids[:1, :shared], use_cache=True, logits_to_keep=1)
        cache = head.past_key_values
        cache.batch_repeat_interleave(len(batch))
        out = model(
            input_ids=batch.input_ids[:, shared:],
            attention_mask=batch.attention_mask,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
    else:
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            use_cache=False,
            logits_to_keep=keep,
        )
    logits = out.logits
    n, resp = batch.response_ids.shape
    offsets = (
        torch.arange(resp, device=logits.device)[None, :]
        + batch.prompt_len[:, None]
        - 1
        - (width - logits.shape[1])
    )
    offsets = offsets.clamp(min=0, max=logits.shape[1] - 1)
    picked = logits.gather(1, offsets[:, :, None].expand(n, resp, logits.shape[-1]))
    logp = torch.log_softmax(picked.float(), dim=-1)
    return logp.gather(-1, batch.response_ids[:, :, None]).squeeze(-1)


def forward_work(batch: Batch, share_prefix: bool = True) -> tuple[int, int]:
    """What `response_log_probs` computes for `batch`: (positions run through the layers, positions
    projected to the vocabulary). The shared prefix runs once; padding is not counted. Benches turn
    these into model FLOPs (bench/roofline.py)."""
    shared = shared_prefix_len(batch) if share_prefix else 0
    layers = int(batch.attention_mask.sum()) - shared * (len(batch) - 1)
    return layers, logit_positions(batch) * len(batch)


def logit_positions(batch: Batch) -> int:
    """Positions per row whose logits `response_log_probs` needs: from the earliest response on."""
    return max(1, batch.input_ids.shape[1] - int(batch.prompt_len.min()) + 1)


MIN_SHARED_PREFIX = 32
"""Below this many common tokens a separate prefix forward costs more than it saves."""


def shared_prefix_len(batch: Batch) -> int:
    """How many leading tokens every row of `batch` has in common, up to the first position whose
    logits are needed (the earliest response token's predecessor); 0 if not worth sharing."""
    if len(batch) < 2:
        return 0
    ids = batch.input_ids
    limit = int(batch.prompt_len.min()) - 1
    same = (ids[:, :limit] == ids[:1, :limit]).all(0)
    differ = (~same).nonzero()
    common = int(differ[0]) if len(differ) else limit
    return common if common >= MIN_SHARED_PREFIX else 0


def check_name(key: str, name: str) -> str:
    """`name` if verl resolves it as `key` (adv_estimator, loss_mode, kl_loss_type), else ValueError.
    Asked of verl's own registries, so every estimator or loss verl adds is accepted as it is."""
    from verl.trainer.ppo import core_algos

    if key == "adv_estimator":
        known = sorted(str(k) for k in core_algos.ADV_ESTIMATOR_REGISTRY)
        ok = name in core_algos.ADV_ESTIMATOR_REGISTRY
    elif key == "loss_mode":
        known = sorted(core_algos.POLICY_LOSS_REGISTRY)
        ok = name in core_algos.POLICY_LOSS_REGISTRY
    else:
        known = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "(any of them)+"]
        try:
            core_algos.kl_penalty(torch.zeros(1), torch.zeros(1), name)
            ok = True
        except NotImplementedError:
            ok = False
    if not ok:
        raise ValueError(f"verl has no {key} {name!r}; known: {', '.join(known)}")
    return name


def outcome_rewards(rewards: list[float], response_mask: torch.Tensor) -> torch.Tensor:
    """verl's `token_level_rewards`: the episode reward on the last model token, zero elsewhere."""
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    for i, value in enumerate(rewards):
        where = torch.nonzero(response_mask[i] > 0)
        if len(where):
            out[i, int(where[-1])] = float(value)
    return out


def compute_advantages(
    estimator: str,
    rewards: list[float],
    response_mask: torch.Tensor,
    group_ids: list[str],
    norm_adv_by_std_in_grpo: bool = True,
    algo_config: Any = None,
) -> torch.Tensor:
    """Advantages from verl's registered estimator `estimator` (grpo, rloo, grpo_passk, ...)."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    fn = get_adv_estimator_fn(estimator)
    offered: dict[str, Any] = {
        "token_level_rewards": outcome_rewards(rewards, response_mask),
        "response_mask": response_mask,
        "index": np.array(group_ids, dtype=object),
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
        "config": algo_config,
    }
    params = inspect.signature(fn).parameters
    advantages, _returns = fn(**{k: v for k, v in offered.items() if k in params})
    return advantages * response_mask


def actor_config(
    loss_mode: str,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    batch_tokens: int,
    batch_size: int,
) -> Any:
    """verl's ActorConfig carrying the clip ratios and the whole step's token/sequence counts.

    `global_batch_info` makes `agg_loss` normalise each micro-batch by the *step's* totals, so the
    micro-batch losses add up to the loss of the whole batch (as verl does across data ranks).
    """
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="fsdp",
        clip_ratio=clip_ratio_low,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=1,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        global_batch_info={"dp_size": 1, "batch_num_tokens": batch_tokens, "global_batch_size": batch_size},
    )


def policy_loss(
    loss_mode: str,
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's policy loss `loss_mode` (vanilla = PPO clip, gspo, cispo, ...) and its metrics.
    `rollout_is_weights` (train/mismatch.py) scale the per-token loss inside verl's function."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    fn = get_policy_loss_fn(loss_mode)
    extra = {} if rollout_is_weights is None else {"rollout_is_weights": rollout_is_weights}
    return fn(
        old_log_prob=old_log_probs,
        log_prob=log_probs,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        **extra,
    )


def kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_type: str,
    loss_agg_mode: str,
    config: Any,
) -> torch.Tensor:
    """verl's `use_kl_loss` term: `kl_penalty` per token, aggregated like the policy loss."""
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

    kld = kl_penalty(log_probs, ref_log_probs, kl_type)
    return agg_loss(kld, response_mask, loss_agg_mode, **config.global_batch_info)
