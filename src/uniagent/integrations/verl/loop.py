"""`UniAgentLoop`: verl's `AgentLoopBase` running uniagent episodes.

verl's `AgentLoopWorker` instantiates one agent loop per dataset row (hydra, from the YAML named by
`actor_rollout_ref.rollout.agent.agent_loop_config_path`) and awaits `run(sampling_params, **row)`.
This loop rebuilds the row's uniagent Task and runs it with `run_episode`, the same function
`uniagent run` uses: same sandbox, tools, AgentInteraction, verifier. Only the model differs: a
`TokenChatModel` over `VerlEngine`, so the trajectory verl trains on is the token stream the policy
actually produced, with its rollout logprobs.

Settings come from the agent-loop YAML entry's keys (hydra passes them as kwargs) and, overriding
those, from a `uniagent:` section of the trainer config (`+uniagent.agent.max_turns=20` on the
command line). Never from environment variables: a rollout worker on another node must behave the
same as the driver that was configured.

Length rules (`episode_output`): the prompt is never cut from the head. A prompt longer than
`rollout.prompt_length` keeps its first `prompt_length` tokens in `prompt_ids` and carries the rest
at the head of the response as context (mask 0), so prompt + response is still exactly the token
sequence the policy saw. The response is then cut at `rollout.response_length`, ids, mask and
logprobs at the same index.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from uniagent.agent import AgentConfig, EpisodeResult
from uniagent.integrations.verl.engine import VerlEngine
from uniagent.integrations.verl.spec import spec_from_extra_info, task_from_spec
from uniagent.models.base import SamplingParams
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.tasks.episode import run_episode
from uniagent.tokens import ChatCodec

log = logging.getLogger(__name__)


class UniAgentLoopSettings(BaseModel):
    """What the agent-loop YAML entry (and the trainer config's `uniagent:` section) may set."""

    model_config = ConfigDict(extra="forbid")

    sandbox: dict[str, Any] = Field(default_factory=lambda: {"type": "local"}, description="DeployConfig")
    agent: dict[str, Any] = Field(default_factory=dict, description="AgentConfig fields (budgets)")
    parser: str = Field("hermes", description="tool-call format the policy writes")
    native_tools: bool | None = Field(None, description="None: native when the template renders tools")
    max_tokens_per_turn: int | None = Field(
        None, ge=1, description="cap per model turn; default rollout.response_length"
    )
    untrainable_mask: Literal["zero", "keep"] = Field(
        "zero", description="zero: infrastructure failures contribute no gradient (their mask is all 0)"
    )
    server_params: dict[str, Any] = Field(default_factory=dict, description="extra sampling keys for verl")
    max_resumes: int = Field(50, ge=0, description="aborted turns resumed before model_error")
    resume_delay_s: float = Field(1.0, ge=0.0)


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _settings(yaml_kwargs: dict[str, Any], trainer_config: Any) -> UniAgentLoopSettings:
    merged = {k: _plain(v) for k, v in yaml_kwargs.items()}
    section = trainer_config.get("uniagent") if trainer_config is not None else None
    for key, value in (_plain(section) or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return UniAgentLoopSettings(**merged)


class UniAgentLoop(AgentLoopBase):
    """One uniagent episode per verl dataset row; see the module docstring."""

    _SETTING_KEYS = frozenset(UniAgentLoopSettings.model_fields)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        yaml_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in self._SETTING_KEYS}
        kwargs.pop("name", None)  # the registry name hydra passes back from the YAML entry
        kwargs.pop("tools", None)  # verl's own tools; uniagent tasks bring theirs
        super().__init__(*args, **kwargs)
        self.settings = _settings(yaml_kwargs, self.config)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.codec = ChatCodec(
            self.tokenizer, template_kwargs=dict(_plain(self.apply_chat_template_kwargs) or {})
        )

    def agent_config(self) -> AgentConfig:
        """The episode's budgets; the context never exceeds what verl can hold for one sample."""
        cfg = AgentConfig(**self.settings.agent)
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
            max_tokens=self.settings.max_tokens_per_turn or self.response_length,
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        spec = spec_from_extra_info(kwargs.get("extra_info"))
        task = task_from_spec(spec)
        extra = {k: sampling_params[k] for k in ("repetition_penalty",) if sampling_params.get(k) is not None}
        engine = VerlEngine(
            self.server_manager,
            server_params={**extra, **self.settings.server_params},
            max_resumes=self.settings.max_resumes,
            resume_delay_s=self.settings.resume_delay_s,
        )
        request_id = f"{task.instance_id}#{uuid.uuid4().hex[:12]}"
        model = TokenChatModel(
            engine,
            self.codec,
            get_parser(self.settings.parser),
            self.sampling(sampling_params),
            request_id=request_id,
            native_tools=self.settings.native_tools,
        )
        result = await run_episode(task, model, self.agent_config(), dict(self.settings.sandbox))
        if result.trajectory is None:  # no turn ran (sandbox or setup failed): the prompt alone
            prompt_ids = self.codec.prompt_ids(task.messages())
        else:
            prompt_ids = result.trajectory.prompt_ids
        return episode_output(
            result,
            prompt_ids,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            untrainable_mask=self.settings.untrainable_mask,
            engine=engine,
            request_id=request_id,
        )


def episode_output(
    result: EpisodeResult,
    prompt_ids: list[int],
    *,
    prompt_length: int,
    response_length: int,
    untrainable_mask: Literal["zero", "keep"] = "zero",
    engine: VerlEngine | None = None,
    request_id: str | None = None,
) -> AgentLoopOutput:
    """An episode as verl's `AgentLoopOutput`, within verl's lengths and never misaligned."""
    traj = result.trajectory
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
    trainable = result.trainable
    if not trainable and untrainable_mask == "zero":
        mask = [0] * len(mask)
    reward = float(result.reward.value) if result.reward is not None else 0.0
    metrics = result.metrics
    extra_fields: dict[str, Any] = {
        "exit_reason": result.exit_reason.value,
        "trainable": trainable,
        "drift": None if traj is None else traj.drift,
        "instance_id": metrics.get("instance_id"),
        "request_id": request_id,
        "prompt_overflow": overflow,
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
