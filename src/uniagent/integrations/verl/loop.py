"""`UniAgentLoop`: verl's `AgentLoopBase` running uniagent episodes.

verl's `AgentLoopWorker` instantiates one agent loop per dataset row (hydra, from the YAML named by
`actor_rollout_ref.rollout.agent.agent_loop_config_path`) and awaits `run(sampling_params, **row)`.
This loop rebuilds the row's uniagent Task and runs it with `run_episode`, the same function
`uniagent run` uses: same sandbox, tools, agent (`agent.kind`, default the ReAct loop; a harness
agent gets a gateway over this sample's engine), verifier. Only the model differs: a
`TokenChatModel` over `VerlEngine` (made by `ModelFactory.over_engine`), so the trajectory verl trains
on is the token stream the policy actually produced, with its rollout logprobs.

Settings come from the agent-loop YAML entry's keys (hydra passes them as kwargs) and, overriding
those, from a `uniagent:` section of the trainer config (`+uniagent.agent.max_turns=20` on the
command line). Never from environment variables: a rollout worker on another node must behave the
same as the driver that was configured.

Length rules (`episode_output`): the prompt is never cut from the head. A prompt longer than
`rollout.prompt_length` keeps its first `prompt_length` tokens in `prompt_ids` and carries the rest
at the head of the response as context (mask 0), so prompt + response is still exactly the token
sequence the policy saw. The response is then cut at `rollout.response_length`, ids, mask and
logprobs at the same index.

Segments (`episode_outputs`): an episode whose history stopped being append-only (context
condensed, a harness rewrote messages) has several segments, each an exact token sequence with its
own prompt. verl 0.9's V1 trainer takes several outputs per sample: `AgentLoopWorkerTQ` (verl's
`trainer/ppo/v1/agent_loop_tq.py`) accepts `AgentLoopOutput | list[AgentLoopOutput]` from `run`,
stores each as a row keyed `{uid}_{session_id}_{index}` with the final output's reward, and
`compute_advantage_for_multi_trajectories` (`trainer/ppo/v1/utils.py`) computes GRPO on each
session's final output and broadcasts it to the session's rows. So under that worker (it passes
`session_id`; nothing else does) `run` returns one output per segment that holds model tokens, in
order, and every generated token is trained with the episode's advantage; GSPO's sequence ratio is
then per segment (verl's `compute_policy_loss_gspo` normalises over a row's mask). Use GRPO there:
verl's other estimators see each segment as a sample of the group. verl's other workers take one
output per sample: the legacy `AgentLoopWorker._agent_loop_postprocess` pads exactly one output,
and `RayPPOTrainer.fit` (`main_ppo` with `trainer.use_v1=False`, what the recipes set but
`multiturn_grpo_v1_cpu`) unions the generated batch row for row with the prompts
(`batch.union(gen_batch_output)`); the fully-async rollouter uses the same worker. There the loop
returns the episode's last segment (the one that ends in the answer the reward is for) and says what
was left out in `extra_fields` (`segments_dropped`, `dropped_model_tokens`); an episode of one segment
loses nothing.

Secrets: every episode goes through `uniagent.redact` (the environment's secrets and the sandbox
settings' tokens) before verl sees it, as `uniagent run` stores it: an episode whose tokens held a
secret reaches verl with the secret's tokens replaced, an all-zero response mask (whatever
`untrainable_mask` says) and `untrainable_reason: secret_redacted` in its extra fields, so neither
the update nor verl's `rollout_data_dir` dump (decoded ids) holds the secret.

Start-up checks (`settings.py`): the merged settings are validated in the constructor, the first
uniagent code verl runs on a rollout worker, so a misspelt key fails the step with one line before
the sample's episode starts (`uniagent verl command|launch` checks the same before launching).

Infrastructure failures (`BatchGuard`): each `run` handles one sample, so the loop tracks the samples
that verl's worker started together (one `generate_sequences` call gathers them in one event-loop
turn) and, when the last of them ends, raises `TrainingError` if more than
`max_infra_failure_share` of them ended in an untrainable exit reason. The exception leaves `run`,
so verl's `asyncio.gather` in `AgentLoopWorker.generate_sequences` fails and so does the step
instead of training on what is left: under `main_ppo`'s legacy trainer (`trainer.use_v1=False`, what
the recipes set but `multiturn_grpo_v1_cpu`) the batch is the worker's chunk of the step and the run
stops; under the fully-async rollouter it is one prompt's group, and the exception ends the
rollouter's stream. Under verl's V1 trainer (`trainer.use_v1=True`) workers fire and forget each
prompt and a raise only tags its group `failure` (verl logs it and trains on the group's other
sessions), so there the loop does not raise: every output carries its exit reason and the loop's
share (`extra_fields`), and uniagent's replay buffer (`sampler.py`, verl's
`trainer.v1.sampler.custom_sampler`) checks the step's whole batch before verl trains on it. Without
that replay buffer nothing would check, so a V1 run with the check on and another replay buffer
fails every sample (`check_v1_sampler`), and `uniagent verl command|launch` refuses it before
launching (`launch.check_trainer_path`). An output with no response
(no turn ran) gets one untrained token under V1 (`untrained_token`), which V1's storage needs.

A dead rollout server (`engine.RolloutServerLost`: its Ray actor died under a call) is not a share: the
episode that met it ends `model_error` like any engine failure, and then `run` raises
`TrainingError` naming the server and the step (counted from the weights version the batch's
replies carried: step N's rollout serves the weights of step N-1), whatever its siblings did, so
the step fails the same way instead of training on the samples that finished before the death.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from uniagent.agent import AgentConfig, EpisodeResult, ExitReason
from uniagent.agent.base import open_agent
from uniagent.agent.result import check_infra_failures
from uniagent.errors import ConfigError
from uniagent.integrations.verl.engine import VerlEngine
from uniagent.integrations.verl.settings import (
    SETTING_KEYS,
    SHARE_FIELD,
    V1_SAMPLER,
    UniAgentLoopSettings,
    merge_settings,
    validate_settings,
)
from uniagent.integrations.verl.spec import spec_from_extra_info, task_from_spec
from uniagent.models.base import SamplingParams
from uniagent.models.factory import ModelFactory
from uniagent.redact import setting_secrets, shared_redactor
from uniagent.tasks.episode import run_episode
from uniagent.tokens import ChatCodec, Trajectory
from uniagent.train.filters import is_overlong, is_unfinished

log = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _settings(yaml_kwargs: dict[str, Any], trainer_config: Any, entry: str) -> UniAgentLoopSettings:
    section = trainer_config.get("uniagent") if trainer_config is not None else None
    merged = merge_settings({k: _plain(v) for k, v in yaml_kwargs.items()}, _plain(section))
    return validate_settings(merged, entry)


class _Batch:
    """Samples verl's worker started together, and how each ended."""

    def __init__(self) -> None:
        self.size = 0
        self.ended: list[tuple[ExitReason, str | None]] = []
        self.engines: list[VerlEngine] = []
        self.raised = False

    def served_version(self) -> int | None:
        """The newest weights version (verl's `global_steps`) any of the batch's replies carried."""
        seen = [e.max_global_steps for e in self.engines if e.max_global_steps is not None]
        return max(seen) if seen else None


class BatchGuard:
    """Groups the `run` calls that start in one event-loop turn (verl's worker creates a call's tasks
    in one loop, so they all take their first step in the same turn) and checks each group's
    infrastructure failures when its last sample ends. One per process: one per verl worker."""

    def __init__(self) -> None:
        self._joining: tuple[asyncio.AbstractEventLoop, _Batch] | None = None

    async def join(self) -> _Batch:
        loop = asyncio.get_running_loop()
        if self._joining is None or self._joining[0] is not loop:
            self._joining = (loop, _Batch())
            loop.call_soon(self._seal, self._joining)
        batch = self._joining[1]
        batch.size += 1
        await asyncio.sleep(0)  # the siblings join in this turn; the batch is sealed before we go on
        return batch

    def _seal(self, joining: tuple[asyncio.AbstractEventLoop, _Batch]) -> None:
        if self._joining is joining:
            self._joining = None

    @staticmethod
    def end(batch: _Batch, reason: ExitReason, error: str | None, max_share: float | None) -> None:
        """Record one sample; the last one checks the batch (`max_share` None: no check), unless one
        of its samples raised (`raised`): that failed the step already, a second error adds nothing."""
        batch.ended.append((reason, error))
        if max_share is not None and not batch.raised and len(batch.ended) == batch.size:
            check_infra_failures(
                batch.ended,
                max_share,
                "uniagent.max_infra_failure_share",
                where=f"verl rollout batch of {batch.size} sample(s) on this agent-loop worker",
            )


GUARD = BatchGuard()


class UniAgentLoop(AgentLoopBase):
    """One uniagent episode per verl dataset row; see the module docstring."""

    _SETTING_KEYS = SETTING_KEYS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        yaml_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in self._SETTING_KEYS}
        entry = str(kwargs.pop("name", "uniagent"))  # the registry name hydra passes back from the YAML entry
        kwargs.pop("tools", None)  # verl's own tools; uniagent tasks bring theirs
        super().__init__(*args, **kwargs)
        self.settings = _settings(yaml_kwargs, self.config, entry)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.codec = ChatCodec(
            self.tokenizer, template_kwargs=dict(_plain(self.apply_chat_template_kwargs) or {})
        )
        self.redactor = shared_redactor(setting_secrets(self.settings.sandbox), self.tokenizer)

    def agent_config(self) -> AgentConfig:
        """The episode's budgets; the context never exceeds what verl can hold for one sample."""
        cfg = self.settings.agent
        room = self.prompt_length + self.response_length
        limit = min(cfg.max_context_tokens or room, room)
        return cfg.model_copy(update={"max_context_tokens": limit})

    def sampling(self, sampling_params: dict[str, Any]) -> SamplingParams:
        """verl's per-batch sampling (training or validation) plus uniagent's per-turn cap."""
        top_k = sampling_params.get("top_k", -1)
        return SamplingParams(
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=-1 if top_k is None or int(top_k) <= 0 else int(top_k),
            max_tokens=self.settings.max_tokens(self.response_length),
        )

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """One output per trained segment under verl's V1 worker, else the last segment (module docstring)."""
        if takes_several_outputs(kwargs):
            check_v1_sampler(self.config, self.settings)
        batch = await GUARD.join()
        try:
            outputs = await self._run(batch, sampling_params, **kwargs)
        except BaseException as exc:  # it fails the step by itself; counted so the batch still completes
            batch.raised = True
            GUARD.end(batch, ExitReason.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}", None)
            raise
        fields = outputs[-1].extra_fields
        several = takes_several_outputs(kwargs)
        # under V1 the sampler checks the step's batch (`sampler.py`); raising here would lose this sample
        share = None if several else self.settings.max_infra_failure_share
        GUARD.end(batch, ExitReason(fields["exit_reason"]), fields["error"], share)
        return outputs if several else outputs[-1]

    async def _run(
        self, batch: _Batch, sampling_params: dict[str, Any], **kwargs: Any
    ) -> list[AgentLoopOutput]:
        spec = spec_from_extra_info(kwargs.get("extra_info"))
        task = task_from_spec(spec)
        extra = {k: sampling_params[k] for k in ("repetition_penalty",) if sampling_params.get(k) is not None}
        engine = VerlEngine(
            self.server_manager,
            server_params={**extra, **self.settings.server_params},
            max_resumes=self.settings.max_resumes,
            resume_delay_s=self.settings.resume_delay_s,
        )
        batch.engines.append(engine)
        request_id = f"{task.instance_id}#{uuid.uuid4().hex[:12]}"
        models = ModelFactory.over_engine(
            engine,
            self.codec,
            self.settings.model,
        )
        model = models.new_model(
            task.instance_id, 0, request_id=request_id, sampling=self.sampling(sampling_params).model_dump()
        )
        async with open_agent(self.settings.agent.kind, engine, self.codec) as agent:
            result = await run_episode(task, model, self.agent_config(), self.settings.sandbox, agent=agent)
        if engine.lost is not None:  # the server is gone for every sample: fail the step, train nothing
            raise engine.lost.step_error(batch.served_version())
        result = await asyncio.to_thread(self.redactor.episode, result, self.tokenizer)
        if result.trajectory is None:  # no turn ran (sandbox or setup failed): the prompt alone
            prompt_ids = self.codec.prompt_ids(self.redactor.data(task.messages()))
        else:
            prompt_ids = result.trajectory.prompt_ids
        outputs = episode_outputs(
            result,
            prompt_ids,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            untrainable_mask=self.settings.untrainable_mask,
            no_gradient=no_gradient_reason(result, self.settings),
            engine=engine,
            request_id=request_id,
            all_segments=takes_several_outputs(kwargs),
        )
        for output in outputs:  # what the V1 sampler checks the step's batch against (`sampler.py`)
            output.extra_fields[SHARE_FIELD] = self.settings.max_infra_failure_share
            if takes_several_outputs(kwargs) and not output.response_ids:
                untrained_token(output, self.tokenizer.eos_token_id)
        return outputs


def check_v1_sampler(config: Any, settings: UniAgentLoopSettings) -> None:
    """Under V1 with the check on, the run's replay buffer must be uniagent's (`sampler.py`), which does
    the check: without it nothing would. The `ConfigError` fails every sample, and verl's sync sampler
    then stops the run (`replay_buffer.py` lines 505-510: no trajectories to train on)."""
    if settings.max_infra_failure_share >= 1.0:
        return
    sampler = OmegaConf.select(config, "trainer.v1.sampler.custom_sampler", default=None) or {}
    named = {f"trainer.v1.sampler.custom_sampler.{k}": sampler.get(k) for k in ("path", "name")}
    if named != V1_SAMPLER:
        raise ConfigError(
            f"uniagent.max_infra_failure_share={settings.max_infra_failure_share:g} under verl's V1 trainer "
            "needs uniagent's replay buffer, which does the check: "
            + " ".join(f"{k}={v}" for k, v in V1_SAMPLER.items())
            + " (or +uniagent.max_infra_failure_share=1.0)"
        )


def untrained_token(output: AgentLoopOutput, token_id: int) -> None:
    """Give an output with no response (no turn ran: the sandbox or the first model call failed) one
    end-of-sequence token with mask 0. verl's V1 worker stores each output as it is, and
    `AgentLoopOutput.as_dict` puts the reward on the response's last token (`agent_loop.py:147`), which
    an empty response does not have: the session would raise and its sample be lost. The token trains
    nothing; the sample keeps its reward in its group and its exit reason for the V1 check."""
    output.response_ids = [token_id]
    output.response_mask = [0]
    output.response_logprobs = [0.0] if output.response_logprobs is not None else None
    output.extra_fields["response_padded"] = 1


def no_gradient_reason(result: EpisodeResult, settings: UniAgentLoopSettings) -> str | None:
    """Why a trainable episode keeps its reward in its group but gets no gradient (an all-zero mask):
    the local trainer's rules (`train/filters.py`), which verl's group baseline then follows."""
    if not result.trainable:
        return None
    if settings.unfinished == "baseline_only" and is_unfinished(result):
        return "unfinished"
    if settings.overlong_filter and is_overlong(result):
        return "overlong"
    return None


def takes_several_outputs(row: dict[str, Any]) -> bool:
    """Whether the verl worker that called `run` with `row` takes a list of outputs: verl 0.9's
    `AgentLoopWorkerTQ._run_prompt` (the V1 trainer) passes `session_id`; its legacy
    `AgentLoopWorker`, the fully-async rollouter's, passes only the dataset row and takes one."""
    return "session_id" in row


def episode_outputs(
    result: EpisodeResult,
    prompt_ids: list[int],
    *,
    all_segments: bool = True,
    **kw: Any,
) -> list[AgentLoopOutput]:
    """The episode as verl outputs: one per segment holding model tokens (`all_segments`), else the last
    segment alone with what it leaves out in `extra_fields`; the prompt alone when no turn ran."""
    segments = list(result.segments or [])
    if not segments:
        return [episode_output(result, prompt_ids, **kw)]
    last = len(segments) - 1
    if not all_segments:
        left = [t for t in segments[:-1] if t.num_model_tokens > 0]
        dropped = sum(t.num_model_tokens for t in left)
        return [
            episode_output(
                result,
                prompt_ids,
                segment=segments[-1],
                segment_index=last,
                segments_dropped=len(left),
                dropped_model_tokens=dropped,
                **kw,
            )
        ]
    trained = [i for i, t in enumerate(segments) if t.num_model_tokens > 0] or [last]
    return [episode_output(result, prompt_ids, segment=segments[i], segment_index=i, **kw) for i in trained]


def episode_output(
    result: EpisodeResult,
    prompt_ids: list[int],
    *,
    prompt_length: int,
    response_length: int,
    untrainable_mask: Literal["zero", "keep"] = "zero",
    no_gradient: str | None = None,
    engine: VerlEngine | None = None,
    request_id: str | None = None,
    segment: Trajectory | None = None,
    segment_index: int | None = None,
    segments_dropped: int = 0,
    dropped_model_tokens: int = 0,
) -> AgentLoopOutput:
    """One segment of an episode (`segment`, default the last) as verl's `AgentLoopOutput`, within
    verl's lengths and never misaligned; `prompt_ids` when the episode has no segment."""
    traj = segment if segment is not None else result.trajectory
    prompt = list(traj.prompt_ids if traj is not None else prompt_ids)
    response = list(traj.response_ids) if traj is not None else []
    mask = list(traj.response_mask) if traj is not None else []
    logprobs = list(traj.response_logprobs) if traj is not None else []
    overflow = max(0, len(prompt) - prompt_length)
    if overflow:  # keep the head; the tail rides at the front of the response as context
        spill = prompt[prompt_length:]
        prompt = prompt[:prompt_length]
        response, mask, logprobs = spill + response, [0] * overflow + mask, [0.0] * overflow + logprobs
    cut = max(0, len(response) - response_length)
    response, mask, logprobs = response[:response_length], mask[:response_length], logprobs[:response_length]
    metrics = result.metrics
    trainable = result.trainable
    # `keep` is for an infrastructure failure's model tokens; tokens a secret was cut out of are not
    # what the policy produced (`untrainable_reason`), so they never keep a mask.
    if not trainable and (untrainable_mask == "zero" or metrics.get("untrainable_reason")):
        mask = [0] * len(mask)
    if no_gradient:  # in the group's baseline (its reward stays), no gradient (`no_gradient_reason`)
        mask = [0] * len(mask)
    reward = float(result.reward.value) if result.reward is not None else 0.0
    extra_fields: dict[str, Any] = {
        "exit_reason": result.exit_reason.value,
        "trainable": trainable,
        "untrainable_reason": metrics.get("untrainable_reason"),
        "no_gradient": no_gradient,
        "drift": None if traj is None else traj.drift,
        "segment_index": segment_index,
        "segment_reason": None if traj is None else traj.reason,
        "segments": len(result.segments or []),
        "segments_dropped": segments_dropped,
        "dropped_model_tokens": dropped_model_tokens,
        "instance_id": metrics.get("instance_id"),
        "request_id": request_id,
        "prompt_overflow": overflow,
        "response_padded": 0,
        "response_cut": cut,
        "error": result.error,
        "resumed_turns": engine.resumes if engine else 0,
        "min_global_steps": engine.min_global_steps if engine else None,
        "max_global_steps": engine.max_global_steps if engine else None,
        "turn_scores": [],
        "tool_rewards": [],
        # Same keys for every sample: verl moves them into the batch and its validation metrics.
        "reward_extra_info": {"resolved": float(result.resolved)},
    }
    return AgentLoopOutput(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        reward_score=reward,
        num_turns=len(result.messages),
        metrics=AgentLoopMetrics(
            generate_sequences=float(metrics.get("model_s", 0.0)),
            tool_calls=float(metrics.get("tools_s", 0.0)),
            num_preempted=engine.num_preempted if engine and engine.calls else -1,
        ),
        extra_fields=extra_fields,
    )
