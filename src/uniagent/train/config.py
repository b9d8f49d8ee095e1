"""`TrainConfig`: one YAML file plus `--set` overrides, the same way `uniagent run` is configured.

Every section forbids unknown keys, so a misspelt setting is an error that names it. The `algo`
names are verl's (`adv_estimator`, `loss_mode`, `loss_agg_mode`, `clip_ratio_*`, `kl_loss_*`) so
a recipe reads the same for `--engine local` and `--engine verl`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uniagent.agent.config import AgentConfig
from uniagent.config import build
from uniagent.errors import ConfigError
from uniagent.models.config import ModelConfig
from uniagent.models.factory import local_weights
from uniagent.models.registry import ENGINES
from uniagent.runner.config import TasksConfig
from uniagent.sandbox.config import SandboxSection, default_section
from uniagent.tasks.registry import SuiteSpec


def trainable_model(model: ModelConfig) -> ModelConfig:
    """The model section of a training config: weights this process loads (the local trainer, and
    verl's FSDP trainer from the same key), so `local`, `local:PATH` or a bare model directory /
    .gguf path (made `local:PATH`); an endpoint's kind, or a setting only a served model has, is a
    `ConfigError`."""
    try:
        local_weights(model.spec)
    except ConfigError as exc:
        raise ConfigError(f"model.spec: {exc}") from None
    endpoint_only = model.model_fields_set & NOT_TRAINED
    if endpoint_only:
        key = sorted(endpoint_only)[0]
        raise ConfigError(
            f"model.{key} does not apply to training (it sets a served or replayed model; the trainer "
            "loads the weights itself): remove it"
        )
    return model


NOT_TRAINED = frozenset(
    {
        "name",
        "api_key_env",
        "tokenizer",
        "replay_delay_s",
        "max_retries",
        "timeout_s",
        "remote",
        "memory_budget_bytes",
        "prefix_cache_bytes",
    }
)


def _bare_path_is_local(data: Any) -> Any:
    """`model.spec: /models/x` (the local trainer's shorthand) as `local:/models/x`, before the
    shared `ModelConfig` checks the kind."""
    if isinstance(data, dict) and isinstance(data.get("spec"), str):
        name = data["spec"].partition(":")[0]
        if name not in ENGINES:
            return {**data, "spec": f"local:{data['spec']}"}
    return data


class TrainTasksConfig(TasksConfig):
    """The run's task section, with the toy tasks as the default: a first `uniagent train` needs
    no dataset."""

    spec: SuiteSpec = Field("toy", description="toy | toy:FILE | builtin:NAME | a task file")


def algo_name(key: str, name: str) -> str:
    """`name` if verl's core_algos knows it for `key`, else a ValueError listing what it knows."""
    from uniagent.train import algo

    return algo.check_name(key, name)


class RolloutCorrectionSection(BaseModel):
    """verl's `algorithm.rollout_correction` (decoupled mode, IS weights only), off by default.

    The local trainer's engine serves the trainer's own weights, so its rollout/recompute gap is
    float noise; a correction matters when rollouts come from another engine (llama.cpp, vLLM,
    SGLang) or precision. The gap is reported every step either way.
    """

    model_config = ConfigDict(extra="forbid")

    rollout_is: Literal["token", "sequence"] | None = Field(
        None,
        description="None: report the gap only; token: per-token truncated IS (TIS); sequence: per-sequence",
    )
    rollout_is_threshold: float = Field(2.0, gt=0, description="TIS: weights above this are clamped to it")
    rollout_is_threshold_lower: float | None = Field(
        None, gt=0, description="set: IcePop instead of TIS, weights outside [lower, threshold] become 0"
    )

    @field_validator("rollout_is_threshold", "rollout_is_threshold_lower", mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # YAML's yes/no/true would pass as 1.0 / 0.0
            raise ValueError("a threshold is a positive number, not a boolean")
        return value

    @model_validator(mode="after")
    def _bounds(self) -> RolloutCorrectionSection:
        lower = self.rollout_is_threshold_lower
        if lower is not None and lower > self.rollout_is_threshold:
            raise ValueError("rollout_is_threshold_lower must be <= rollout_is_threshold")
        return self

    @property
    def threshold_spec(self) -> float | str:
        """verl's `rollout_is_threshold`: the upper bound, or "lower_upper" for IcePop. Kept as two
        typed numbers here because YAML reads an unquoted `0.5_2` as the float 0.52."""
        if self.rollout_is_threshold_lower is None:
            return self.rollout_is_threshold
        return f"{self.rollout_is_threshold_lower}_{self.rollout_is_threshold}"


class FilterGroupsSection(BaseModel):
    """DAPO dynamic sampling (verl `algorithm.filter_groups`): a group whose episodes all scored the
    same has zero advantage everywhere and trains nothing, so it is dropped and more groups are
    sampled until a step has `trainer.tasks_per_step` groups with signal."""

    model_config = ConfigDict(extra="forbid")

    enable: bool = Field(False, description="drop zero-variance groups, over-sample")
    metric: Literal["reward", "resolved"] = Field(
        "reward", description="what must vary within a group (verl filter_groups.metric: score / acc)"
    )
    max_num_gen_batches: int = Field(
        10, ge=0, description="sync: rollout batches per step at most (0: no cap)"
    )


class AlgoSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adv_estimator: str = Field("grpo", description="verl advantage estimator: grpo, rloo, grpo_passk, ...")
    norm_adv_by_std_in_grpo: bool = Field(True, description="False gives Dr.GRPO")
    loss_mode: str = Field("vanilla", description="verl policy loss: vanilla (PPO clip), gspo, cispo, ...")
    loss_agg_mode: Literal[
        "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = "token-mean"
    clip_ratio_low: float = Field(0.2, ge=0)
    clip_ratio_high: float = Field(0.28, ge=0)
    clip_ratio_c: float = Field(3.0, gt=1.0, description="dual-clip bound for negative advantages")
    kl_loss_coef: float = Field(
        0.0, ge=0, description="> 0 keeps a frozen reference model (verl use_kl_loss)"
    )
    kl_loss_type: str = Field("low_var_kl", description="verl kl_penalty: kl/k1, abs, mse/k2, low_var_kl/k3")
    rollout_correction: RolloutCorrectionSection = Field(
        default_factory=RolloutCorrectionSection,
        description="truncated importance sampling for the rollout engine vs trainer logprob gap",
    )
    filter_groups: FilterGroupsSection = Field(default_factory=FilterGroupsSection)
    overlong_filter: bool = Field(
        False,
        description="DAPO overlong filtering: episodes cut by a length limit (a turn hit max_tokens, or "
        "context_limit) stay in their group's baseline but get no gradient",
    )
    unfinished: Literal["count", "baseline_only", "drop"] = Field(
        "count",
        description="episodes that did not finish (max_turns, context_limit, format_errors, timeout_budget): "
        "count = trained with their reward and in the baseline (verl); baseline_only = in the group's "
        "mean/std, no gradient; drop = left out of the group. Infrastructure failures are always left out.",
    )

    # Names verl resolves only when the first update runs: checked here, before any rollout.
    @field_validator("adv_estimator")
    @classmethod
    def _adv_estimator(cls, name: str) -> str:
        return algo_name("adv_estimator", name)

    @field_validator("loss_mode")
    @classmethod
    def _loss_mode(cls, name: str) -> str:
        return algo_name("loss_mode", name)

    @field_validator("kl_loss_type")
    @classmethod
    def _kl_loss_type(cls, name: str) -> str:
        return algo_name("kl_loss_type", name)


class OptimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")


class TrainerSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(20, ge=1, description="optimizer steps (one rollout batch each)")
    group_size: int = Field(4, ge=1, description="samples per task per step (the GRPO group)")
    tasks_per_step: int = Field(4, ge=1)
    micro_batch_size: int = Field(4, ge=1, description="sequences per forward/backward")
    concurrency: int = Field(32, ge=1, description="episodes at once during a rollout")
    output: Path = Path("runs/train")
    save_every: int = Field(10, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = Field(1, ge=1, description="older checkpoints are deleted")
    seed: int = 0
    tensorboard: bool = Field(True, description="also log to OUTPUT/tensorboard when installed")
    wandb_project: str | None = Field(None, description="also log to this W&B project when installed")
    max_infra_failure_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="a step whose episodes are infrastructure failures beyond this share stops training",
    )
    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: rollout then update, never overlapping; async: rollouts run continuously while "
        "the trainer consumes finished groups (verl fully_async)",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="async: a group may start at most this many policy versions before the update that "
        "trains on it (verl async_training.staleness_threshold, in versions); 0 = on-policy",
    )
    partial_rollout: bool = Field(
        True,
        description="async: at a weight update, in-flight generations are interrupted and resumed under the "
        "new weights (verl async_training.partial_rollout); False: the update waits for them to finish",
    )
    kv_on_update: Literal["recompute", "keep"] = Field(
        "recompute",
        description="async with partial_rollout: what happens to keys/values the old weights computed "
        "at an update. recompute: interrupted rows and every episode's next turn prefill again under "
        "the new weights (each logprob is its version's teacher-forced one); keep: running rows go on "
        "and kept prefixes stay (PipelineRL's in-flight update: no prefill is repeated, each logprob "
        "is still the exact sampling probability, but its context came partly from the old weights)",
    )
    engine_threads: int | None = Field(
        None, ge=1, description="async: torch threads of the rollout engine (default: half the cores, >= 1)"
    )
    trainer_threads: int | None = Field(
        None,
        ge=1,
        description="async: torch threads of the update (default: every core: the update is what an async "
        "step waits for, and the engine idles part of each step)",
    )


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(
        default_factory=lambda: ModelConfig(temperature=1.0, max_tokens=64, max_batch_size=32),
        description="the policy: local (packaged SmolLM2), local:PATH or a model directory / .gguf "
        "file; sampled at temperature 1.0, 64 tokens a turn, 32 rows decoded together by default",
    )
    tasks: TrainTasksConfig = Field(default_factory=TrainTasksConfig)
    agent: AgentConfig = Field(default_factory=lambda: AgentConfig(max_turns=1, max_format_errors=1))
    sandbox: SandboxSection = Field(default_factory=default_section)
    algo: AlgoSection = Field(default_factory=AlgoSection)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    trainer: TrainerSection = Field(default_factory=TrainerSection)

    @field_validator("model", mode="before")
    @classmethod
    def _local_shorthand(cls, data: Any) -> Any:
        return _bare_path_is_local(data)

    @field_validator("model")
    @classmethod
    def _trainable(cls, model: ModelConfig) -> ModelConfig:
        return trainable_model(model)  # its ConfigError passes through pydantic as one line


def build_train_config(path: Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """YAML file (optional) then `KEY=VALUE` overrides, validated; errors name the bad key."""
    return build(TrainConfig, path, overrides)
