"""`VerlEngine`: a uniagent `TokenEngine` over verl's rollout server client.

verl's agent loops talk to the rollout servers through `server_manager.generate(request_id=...,
prompt_ids=..., sampling_params=...) -> TokenOutput(token_ids, log_probs, stop_reason, extra_fields)`.
This engine adapts that call to uniagent's token contract so the same `TokenChatModel` (and so the
same trajectory bookkeeping) runs under `uniagent run` and under verl:

- token ids in, token ids out; the server's logprobs are required (they become rollout_log_probs);
- one sticky request id per episode, so verl routes every turn to the same server (prefix cache);
- a turn aborted by a weight sync (verl's partial rollout) is resumed from the tokens it already
  produced and stitched into one generation, so an interruption never splits or misaligns a turn;
- verl reports `completed` for both a stop and a length cut (vLLM), so the reason is re-derived from
  the tokens: a stop token at the end is `stop`, a full budget is `length`.

verl is never imported here: the server manager is duck-typed (its result needs only the attributes
above), which keeps this module importable without verl.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uniagent.errors import EngineError
from uniagent.models.base import FinishReason, Generation, SamplingParams

_ABORTED = frozenset({"abort", "aborted"})


class VerlEngine:
    """Token engine over verl's `LLMServerClient` (or anything with its `generate` signature).

    `server_params` are extra sampling parameters sent with every request (e.g. the
    `repetition_penalty` verl's worker chose). `request_id`, when given, replaces the caller's id on
    every call so all turns of an episode share it. An aborted turn is resumed up to `max_resumes`
    times, `resume_delay_s` apart (the pause lets a weight sync finish); after that the turn fails
    with `EngineError`, which the agent loop records as `model_error` (never trained on).
    """

    def __init__(
        self,
        server_manager: Any,
        *,
        server_params: dict[str, Any] | None = None,
        request_id: str | None = None,
        max_resumes: int = 50,
        resume_delay_s: float = 1.0,
    ) -> None:
        self.server_manager = server_manager
        self.server_params = dict(server_params or {})
        self.request_id = request_id
        self.max_resumes = max_resumes
        self.resume_delay_s = resume_delay_s
        self.calls = 0
        self.resumes = 0
        self.num_preempted = 0
        self.min_global_steps: int | None = None
        self.max_global_steps: int | None = None

    def params(self, sampling: SamplingParams, max_tokens: int) -> dict[str, Any]:
        """The sampling dict verl's servers accept (vLLM and SGLang both read these keys)."""
        params: dict[str, Any] = {
            **self.server_params,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_tokens": max_tokens,
            "logprobs": True,
        }
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        return params

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> Generation:
        rid = self.request_id or request_id
        budget = sampling.max_tokens
        token_ids: list[int] = []
        logprobs: list[float] = []
        aborts = 0
        while True:
            self.calls += 1
            output = await self.server_manager.generate(
                request_id=rid,
                prompt_ids=[*prompt_ids, *token_ids],
                sampling_params=self.params(sampling, budget - len(token_ids)),
            )
            new = [int(t) for t in (output.token_ids or [])]
            new_lp = getattr(output, "log_probs", None)
            if new and (new_lp is None or len(new_lp) != len(new)):
                raise EngineError(
                    f"verl returned {len(new)} tokens but {0 if new_lp is None else len(new_lp)} logprobs "
                    f"for request {rid!r}; set actor_rollout_ref.rollout.calculate_log_probs=True"
                )
            token_ids += new
            logprobs += [float(x) for x in (new_lp or [])[: len(new)]]
            self._note(output)
            reason = str(getattr(output, "stop_reason", None) or "").lower()
            ended = bool(token_ids) and token_ids[-1] in sampling.stop_token_ids
            if reason in _ABORTED and not ended and len(token_ids) < budget:
                aborts += 1
                self.resumes += 1
                if aborts > self.max_resumes:
                    raise EngineError(
                        f"request {rid!r} was aborted {aborts} times (max_resumes={self.max_resumes})"
                    )
                if self.resume_delay_s > 0:
                    await asyncio.sleep(self.resume_delay_s)
                continue
            return Generation(token_ids, logprobs, self._finish(token_ids, sampling, budget, reason))

    @staticmethod
    def _finish(token_ids: list[int], sampling: SamplingParams, budget: int, reason: str) -> FinishReason:
        if token_ids and token_ids[-1] in sampling.stop_token_ids:
            return "stop"
        if reason == "length" or len(token_ids) >= budget:
            return "length"
        return "stop"  # the model's own eos, or a stop string the server matched

    def _note(self, output: Any) -> None:
        """Track the policy versions (global steps) that produced this episode's tokens."""
        extra = getattr(output, "extra_fields", None) or {}
        lo = extra.get("min_global_steps", extra.get("global_steps"))
        hi = extra.get("max_global_steps", extra.get("global_steps"))
        if lo is not None:
            self.min_global_steps = lo if self.min_global_steps is None else min(self.min_global_steps, lo)
        if hi is not None:
            self.max_global_steps = hi if self.max_global_steps is None else max(self.max_global_steps, hi)
        preempted = getattr(output, "num_preempted", None)
        if preempted:
            self.num_preempted += int(preempted)
