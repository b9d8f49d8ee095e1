"""Weight sync for `LocalEngine`: a queued weight update, its check against the served model, its copy.

`LocalEngine.update_weights` (models/local.py) queues a `WeightUpdate`; the engine's worker thread applies
it between two decode steps, so no forward pass ever runs on half-copied weights. Why it works this way:

- Partial rollout (`interrupt=True`): the rows running at the update are taken out and resumed under the
  new weights as continuations (`BatchRunner.interrupt`: prompt + tokens so far, the same sampling
  stream, the same future). Their keys/values, and every prefix kept for later turns, were computed by
  the old weights: reusing them would make the next tokens' logprobs those of neither policy (old
  attention inputs under new projections). They are dropped and the continuation's prefix is prefilled
  again under the new weights, so the logprob of every token is exactly the one the policy that sampled
  it gives for its exact prefix: what a trainer recomputes and what the version tag promises. The cost
  is one prefill of each interrupted row (measured in the issue-17 report), paid once per update.
- `keep_kv=True` (PipelineRL's in-flight update): the running rows go on with their cache and the kept
  prefixes stay. Tokens after the update are sampled by the new weights attending to keys/values the old
  weights computed. Each token's logprob is still exactly the probability it was sampled with (the
  behaviour policy an importance-sampling correction needs), but no longer what a teacher-forced pass
  under either version gives; the version tag names the weights that sampled it. It costs nothing: no
  prefill is run again, where recomputing costs one prefill of every interrupted row and of every
  episode's next turn.
- `interrupt=False` (verl without partial rollout): no request is admitted while the update waits; the
  running rows finish under the old weights, then it is applied and the queue resumes under the new.
- Everything is checked before anything is copied (`match_state`): a wrong key or shape fails the
  update's future and leaves the old weights and version serving.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from uniagent.errors import EngineError

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(eq=False)
class WeightUpdate:
    """One `update_weights` call: what to copy (None: the version only), the version it makes, whether
    it interrupts running rows, the caller's future, when it was queued (`time.perf_counter`), and
    whether keys/values computed by the old weights are kept (applied mid-batch, nothing interrupted)."""

    state: Mapping[str, torch.Tensor] | None
    version: int
    interrupt: bool
    queued: float
    keep_kv: bool = False
    future: concurrent.futures.Future[dict[str, Any]] = field(default_factory=concurrent.futures.Future)

    @property
    def mid_batch(self) -> bool:
        """Applied between two decode steps of a running batch (else only once the engine is idle)."""
        return self.interrupt or self.keep_kv


def match_state(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], version: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pair every entry of `state` with the served tensor it overwrites, or raise `EngineError`.

    Every parameter must be given (under any of its names: tied weights such as SmolLM2's `lm_head` and
    `embed_tokens` share one tensor, which a `state_dict()` lists twice, and it is copied once); buffers
    may be given. An unknown key, a missing parameter, a non-tensor or a shape that differs refuses the
    whole update, before anything is copied.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    targets = {**dict(model.named_buffers(remove_duplicate=False)), **params}
    aliases: dict[int, list[str]] = {}
    for name, param in params.items():
        aliases.setdefault(id(param), []).append(name)
    missing = [names[0] for names in aliases.values() if not any(n in state for n in names)]
    unknown = [name for name in state if name not in targets]
    wrong = [
        f"{name} {tuple(getattr(value, 'shape', ()))} != {tuple(targets[name].shape)}"
        for name, value in state.items()
        if name in targets and (not isinstance(value, torch.Tensor) or value.shape != targets[name].shape)
    ]
    if missing or unknown or wrong:
        problems = [
            f"{len(items)} {what} ({', '.join(items[:3])}{', ...' if len(items) > 3 else ''})"
            for what, items in (("missing", missing), ("unknown", unknown), ("with a wrong shape", wrong))
            if items
        ]
        raise EngineError(
            f"weight update to version {version} does not fit the served model: {'; '.join(problems)}; "
            "pass the policy's state_dict() (the old weights keep serving)"
        )
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    seen: set[int] = set()
    for name, value in state.items():
        target = targets[name]
        if id(target) not in seen:
            seen.add(id(target))
            pairs.append((target, value))
    return pairs


def copy_state(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Overwrite the served tensors in place (the model object, its attention setup and device stay)."""
    with torch.no_grad():
        for target, value in pairs:
            target.copy_(value)


def resolve(future: concurrent.futures.Future[Any], outcome: Any) -> None:
    """Settle a caller's future unless it was cancelled (or settled) meanwhile; an exception fails it."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
