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
  the tokens: a stop token at the end is `stop`, a full budget is `length`;
- a rollout server (a Ray actor) that dies under a call is `RolloutServerLost`, an `EngineError`
  (the episode ends `model_error`, untrainable) that the engine also keeps (`lost`), so the agent
  loop can fail the whole step: the server is gone for every sample, not just this one.

verl is never imported here: the server manager is duck-typed (its result needs only the attributes
above), which keeps this module importable without verl.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from uniagent.errors import EngineError, TrainingError
from uniagent.models.base import FinishReason, Generation, SamplingParams

_ABORTED = frozenset({"abort", "aborted"})


class RolloutServerLost(EngineError):
    """A rollout server's Ray actor died under a call: `name` and `pid` as Ray reported them (None
    when it did not), `detail` the first line of why."""

    def __init__(self, name: str | None, pid: int | None, detail: str) -> None:
        self.name, self.pid, self.detail = name, pid, detail
        super().__init__(f"{self.what()} died: {detail}")

    def what(self) -> str:
        """`rollout server NAME (pid N)`: the actor as a user finds it in Ray's logs."""
        name = self.name or "(unnamed)"
        kind = "rollout server" if self.name is None or "server" in self.name.lower() else "rollout actor"
        return f"{kind} {name}" + (f" (pid {self.pid})" if self.pid else "")

    def step_error(self, version: int | None) -> TrainingError:
        """The one line the run ends with (`UniAgentLoop.run` raises it): what died, in which step's
        rollout (`version`: the weights version the step's replies carried, step N's rollout serving
        step N-1's weights; None when no reply came)."""
        when = f"during step {version + 1}'s rollout" if version is not None else "during a rollout"
        return TrainingError(
            f"{self.what()} died {when}: {self.detail}; the step is not trained (its episodes are "
            "infrastructure failures); relaunch the same command to resume from the last checkpoint"
        )


def actor_death(exc: BaseException) -> RolloutServerLost | None:
    """`exc` as `RolloutServerLost` when it is Ray's word that an actor died (`RayActorError`:
    `ActorDiedError`, `ActorUnavailableError`), else None. By class name, so that this module needs
    neither Ray nor verl; the name, pid and cause are read from the message Ray writes
    ("\tname: ...", "\tpid: ...", "Worker exit detail: ...")."""
    if not any(cls.__name__ == "RayActorError" for cls in type(exc).__mro__):
        return None
    text = str(exc)
    name = re.search(r"^\s*name: (\S+)", text, re.M)
    pid = re.search(r"^\s*pid: (\d+)", text, re.M)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    detail = re.search(r"Worker exit detail: (.+?\.)(?: |$)", text)
    if detail:
        why = f"its worker process exited ({exit_type.group(1) + ': ' if exit_type else ''}{detail.group(1)})"
    else:
        why = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return RolloutServerLost(name and name.group(1), int(pid.group(1)) if pid else None, why[:300])


class VerlEngine:
    """Token engine over verl's `LLMServerClient` (or anything with its `generate` signature).

    `server_params` are extra sampling parameters sent with every request (e.g. the
    `repetition_penalty` verl's worker chose). `request_id`, when given, replaces the caller's id on
    every call so all turns of an episode share it. An aborted turn is resumed up to `max_resumes`
    times, `resume_delay_s` apart (the pause lets a weight sync finish); after that the turn fails
    with `EngineError`, which the agent loop records as `model_error` (never trained on). A server
    that died under a call fails the turn with `RolloutServerLost`, kept in `lost`.
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
        self.lost: RolloutServerLost | None = None

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
            try:
                output = await self.server_manager.generate(
                    request_id=rid,
                    prompt_ids=[*prompt_ids, *token_ids],
                    sampling_params=self.params(sampling, budget - len(token_ids)),
                )
            except Exception as exc:
                lost = actor_death(exc)
                if lost is None:
                    raise
                self.lost = lost
                raise lost from exc
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
