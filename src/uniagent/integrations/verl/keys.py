"""Every local-trainer setting (`TrainConfig`) and the verl config key(s) it becomes, in one table.

`uniagent train --engine verl --config LOCAL.yaml` moves an experiment written for the local trainer
to a cluster: `translate` turns each setting into hydra overrides of verl's trainer config (or of
`UniAgentLoop`'s `uniagent.*` settings), converting units where they differ, and picks verl's entry
point from `trainer.mode`. A setting verl has no counterpart for says so (`Knob.why`), and when
this config's value makes verl do something else than the local trainer (`Knob.diverges`) the
translation lists it in `dropped` (a warning at launch), so no launch silently runs another
experiment. `tests/test_verl_keys.py` walks `TrainConfig` and fails on a field with neither a
mapping nor a reason, and composes verl's own config to check that every key named here exists.

The unit conversions, read from verl 0.9.1:

- **Batch.** A local step trains `tasks_per_step` groups of `group_size` episodes with one optimizer
  step. verl counts prompts: `data.train_batch_size` prompts per step, `rollout.n` samples each, and
  `train_batch_size / ppo_mini_batch_size` optimizer steps per batch, so both are `tasks_per_step`.
- **Staleness.** Locally a group may start while `groups_started < (version + max_staleness + 1) *
  tasks_per_step` (a version = one optimizer step). verl's fully-async rollouter pauses once the
  samples started since the last weight sync, plus those still running or queued at it, reach
  `ppo_mini_batch_size * require_batches * trigger_parameter_sync_step * (1 + staleness_threshold)`
  (`FullyAsyncRollouter.set_max_required_samples`); a verl version is one weight sync. With
  `require_batches=1` and `trigger_parameter_sync_step=1` a sync is one optimizer step on
  `tasks_per_step` prompts, the two rules are the same, and `staleness_threshold = max_staleness`.
- **Old logprobs.** The local loss takes the engine's logprobs as pi_old (verl's bypass mode,
  `rollout_correction.bypass_mode=True`); with `rollout_is` set it is verl's decoupled mode
  (`bypass_mode=False`: pi_old recomputed by the trainer, truncated IS weights pi_old/pi_rollout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniagent.errors import ConfigError
from uniagent.sandbox.config import as_written
from uniagent.sandbox.settings import SandboxConfig
from uniagent.train.config import NOT_TRAINED, TrainConfig

SYNC_ENTRY = "verl.trainer.main_ppo"
ASYNC_ENTRY = "verl.experimental.fully_async_policy.fully_async_main"
ENTRY_FOR_MODE = {"sync": SYNC_ENTRY, "async": ASYNC_ENTRY}
LOOP = "uniagent."  # keys under this prefix are UniAgentLoop settings (settings.py), not verl's
HUB_SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"

Values = dict[str, Any]


@dataclass(frozen=True)
class Knob:
    """How one local setting (or a whole section, `subtree`) reaches verl.

    `keys`: every verl key (`uniagent.*`: a UniAgentLoop setting) `to_verl` may set; empty for a
    local-only setting. `why`: the conversion, or why verl has no counterpart. `diverges`: whether
    verl, given this config's value, will do something else than the local trainer."""

    keys: tuple[str, ...]
    why: str
    to_verl: Callable[[TrainConfig], Values] | None = None
    diverges: Callable[[TrainConfig], bool] | None = None
    subtree: bool = False
    direct: bool = False  # the local value as is, into keys[0]

    def values(self, cfg: TrainConfig, path: str) -> Values:
        """The verl keys and values this knob sets for `cfg` (`path`: the knob's TrainConfig path)."""
        if self.direct:
            value = local_value(cfg, path)
            return {self.keys[0]: list(value) if isinstance(value, tuple) else value}
        return self.to_verl(cfg) if self.to_verl is not None else {}


def local_value(cfg: TrainConfig, path: str) -> Any:
    """The value at a dotted TrainConfig path."""
    node: Any = cfg
    for part in path.split("."):
        node = getattr(node, part)
    return node


def same(key: str, why: str = "same name and unit") -> Knob:
    """A setting verl has under another path, with the same meaning and unit."""
    return Knob((key,), why, direct=True)


def _is_async(cfg: TrainConfig) -> bool:
    return cfg.trainer.mode == "async"


def verl_device(cfg: TrainConfig) -> str:
    """Where verl trains this config: `model.device` cpu -> "cpu" (the CPU plugin, FSDP2 over gloo, a
    LocalEngine rollout), cuda[:N] -> "cuda" (GPUs, vLLM; verl places its workers itself)."""
    device = cfg.model.device
    if device == "cpu" or device.startswith("cuda"):
        return "cpu" if device == "cpu" else "cuda"
    raise ConfigError(f"model.device {device!r}: verl trains on cpu or cuda")


def _model_path(cfg: TrainConfig) -> Values:
    spec = cfg.model.spec if cfg.model.spec == "local" else cfg.model.spec.removeprefix("local:")
    if spec in ("local", "smollm2"):
        if verl_device(cfg) == "cpu":  # the packaged GGUF, de-quantized to a Hugging Face directory here
            # fully_async_main reads the tokenizer from model.path: one directory with both
            weights = "{smollm2_hf_with_tokenizer}" if _is_async(cfg) else "{smollm2_hf}"
            return {
                "actor_rollout_ref.model.path": weights,
                "actor_rollout_ref.model.tokenizer_path": "{smollm2_tokenizer}",
            }
        return {"actor_rollout_ref.model.path": HUB_SMOLLM2}
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        raise ConfigError(
            f"model.spec {spec!r} is a .gguf file, which verl cannot train (FSDP loads Hugging Face "
            "checkpoints); give the model's Hugging Face directory or hub name"
        )
    return {"actor_rollout_ref.model.path": str(path.resolve()) if path.is_dir() else spec}


_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _dtype(cfg: TrainConfig) -> Values:
    """auto keeps verl's fp32 parameters: its CPU path (and the recipes' exactness checks) is proven in
    fp32; an explicit dtype is verl's parameter dtype."""
    dtype = "float32" if cfg.model.dtype == "auto" else cfg.model.dtype
    if dtype not in _DTYPES:
        raise ConfigError(f"model.dtype {cfg.model.dtype!r}: verl takes auto or one of {', '.join(_DTYPES)}")
    return {"actor_rollout_ref.actor.fsdp_config.model_dtype": _DTYPES[dtype]}


def _tasks(cfg: TrainConfig) -> Values:
    data = data_dir(cfg)
    return {"data.train_files": f"{data}/train.parquet", "data.val_files": f"{data}/train.parquet"}


def data_dir(cfg: TrainConfig) -> str:
    """Where `prepare_data` writes this config's tasks as verl parquet (one dir per task selection)."""
    spec = cfg.tasks.spec
    if spec == "toy" or spec.startswith("toy:"):
        raise ConfigError(
            f"tasks.spec {spec!r} is the local trainer's own toy family, which the verl agent loop "
            "cannot rebuild from a dataset row; use a builtin:NAME suite or a task file"
        )
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in spec.removeprefix("builtin:"))
    if cfg.tasks.family:
        slug += f"-{cfg.tasks.family}"
    if cfg.tasks.limit:
        slug += f"-limit{cfg.tasks.limit}"
    if cfg.tasks.ids:
        slug += f"-ids{len(cfg.tasks.ids)}"
    return f"data/verl/{slug}"


def _steps(cfg: TrainConfig) -> Values:
    steps, per_step = cfg.trainer.steps, cfg.trainer.tasks_per_step
    # total_epochs only bounds the loop; at least one batch per epoch, so `steps` epochs always suffice
    if _is_async(cfg):
        return {"rollout.total_rollout_steps": steps * per_step, "trainer.total_epochs": steps}
    return {"trainer.total_training_steps": steps, "trainer.total_epochs": steps}


def _group_size(cfg: TrainConfig) -> Values:
    n = cfg.trainer.group_size
    return {"actor_rollout_ref.rollout.n": n, **({"rollout.n": n} if _is_async(cfg) else {})}


def _tasks_per_step(cfg: TrainConfig) -> Values:
    per_step = cfg.trainer.tasks_per_step
    if _is_async(cfg):  # fully async: prompts arrive one by one; a step takes one mini-batch of them
        return {
            "data.train_batch_size": 0,
            "data.gen_batch_size": 1,
            "actor_rollout_ref.actor.ppo_mini_batch_size": per_step,
            "async_training.require_batches": 1,
        }
    return {"data.train_batch_size": per_step, "actor_rollout_ref.actor.ppo_mini_batch_size": per_step}


def _staleness(cfg: TrainConfig) -> Values:
    if not _is_async(cfg):
        return {}
    return {
        "async_training.staleness_threshold": float(cfg.trainer.max_staleness),
        "async_training.trigger_parameter_sync_step": 1,
    }


def _logger(cfg: TrainConfig) -> Values:
    """verl's loggers: the console, its file logger always (the run's `metrics.jsonl`, which the
    dashboard and the progress lines read; `launch.metrics_file`), then what the config asks for."""
    sinks = ["console", "file"] + (["tensorboard"] if cfg.trainer.tensorboard else [])
    if cfg.trainer.wandb_project:
        sinks.append("wandb")
    out = {"trainer.logger": sinks}
    if cfg.trainer.wandb_project:
        out["trainer.project_name"] = cfg.trainer.wandb_project
    return out


def _output(cfg: TrainConfig) -> Values:
    out = cfg.trainer.output
    return {"trainer.default_local_dir": str(out / "checkpoints"), "trainer.experiment_name": out.name}


def _bypass(cfg: TrainConfig) -> bool:
    """verl's bypass mode (pi_old = the rollout's logprobs, as locally) only where it keeps the loss:
    `rollout_corr_helper.apply_bypass_mode` replaces `loss_mode` with its own PPO-clip loss."""
    return cfg.algo.rollout_correction.rollout_is is None and cfg.algo.loss_mode == "vanilla"


def _rollout_correction(cfg: TrainConfig) -> Values:
    corr = cfg.algo.rollout_correction
    return {
        "algorithm.rollout_correction.rollout_is": corr.rollout_is,
        "algorithm.rollout_correction.rollout_is_threshold": corr.threshold_spec,
        "algorithm.rollout_correction.bypass_mode": _bypass(cfg),
    }


def _filter_groups(cfg: TrainConfig) -> Values:
    fg = cfg.algo.filter_groups
    if fg.enable and _is_async(cfg):
        raise ConfigError(
            "algo.filter_groups.enable=true: verl's fully-async trainer has no dynamic sampling "
            "(only main_ppo's V1 trainer reads algorithm.filter_groups); set algo.filter_groups.enable=false "
            "or trainer.mode=sync for --engine verl"
        )
    if fg.enable and cfg.trainer.max_infra_failure_share < 1.0:
        raise ConfigError(
            "algo.filter_groups.enable=true: only verl's V1 trainer (trainer.use_v1=True) filters groups, "
            "and there trainer.max_infra_failure_share is checked by uniagent's replay buffer, which verl "
            "gives no group filter (integrations/verl/sampler.py); "
            "set trainer.max_infra_failure_share=1.0 to train with dynamic sampling on verl"
        )
    out: Values = {"algorithm.filter_groups.enable": fg.enable, "algorithm.filter_groups.metric": fg.metric}
    if fg.enable:
        out["trainer.use_v1"] = True
    return out


def _unfinished(cfg: TrainConfig) -> str:
    if cfg.algo.unfinished == "drop":
        raise ConfigError(
            "algo.unfinished=drop: verl's group is every sample of its prompt, so an episode cannot leave "
            "it; use baseline_only (in the baseline, no gradient) or count for --engine verl"
        )
    return cfg.algo.unfinished


def to_loop(name: str, path: str, why: str, *, subtree: bool = False) -> Knob:
    """A UniAgentLoop setting (`+uniagent.NAME`; a section becomes one dotted key per leaf)."""
    return Knob(
        (LOOP + name,), why, lambda cfg: flatten(LOOP + name, local_value(cfg, path)), subtree=subtree
    )


def flatten(prefix: str, value: Any) -> Values:
    if isinstance(value, SandboxConfig):  # the settings as written (each row completes them)
        value = as_written(value)
    elif hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        out: Values = {}
        for key, item in value.items():
            out.update(flatten(f"{prefix}.{key}", item))
        return out
    return {prefix: value}


ACTOR = "actor_rollout_ref.actor."
ROLLOUT = "actor_rollout_ref.rollout."

KNOBS: dict[str, Knob] = {
    # -- model -------------------------------------------------------------------------------------
    "model.spec": Knob(
        ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path"),
        "local -> the same SmolLM2-135M-Instruct: on cuda from the Hub, on cpu the packaged GGUF "
        "de-quantized to a Hugging Face directory (FSDP cannot load a GGUF); a model directory as is; "
        "a .gguf file is refused",
        _model_path,
    ),
    "model.parser": to_loop("model.parser", "model.parser", "UniAgentLoop's tool-call format"),
    "model.template_tools": to_loop(
        "model.template_tools", "model.template_tools", "the same setting of UniAgentLoop's model"
    ),
    "model.history": to_loop("model.history", "model.history", "the same setting of UniAgentLoop's model"),
    "model.temperature": same(ROLLOUT + "temperature", "same unit"),
    "model.top_p": same(ROLLOUT + "top_p", "same unit"),
    "model.max_tokens": to_loop(
        "model.max_tokens",
        "model.max_tokens",
        "UniAgentLoop's cap per model turn (an episode's total stays rollout.response_length)",
    ),
    "model.max_batch_size": Knob(
        (),
        "local only: the CPU engine's decode batch; vLLM/SGLang size theirs to the GPU (nearest: "
        "actor_rollout_ref.rollout.max_num_seqs, kept at verl's value); throughput, not the objective",
    ),
    "model.device": Knob(
        (),
        "the base recipe (local_config.BASE_RECIPE): cpu -> the CPU recipes (verl's CPU plugin, a "
        "LocalEngine rollout), cuda -> the GPU ones (vLLM); verl places its workers itself "
        "(trainer.n_gpus_per_node)",
    ),
    "model.dtype": Knob(
        (ACTOR + "fsdp_config.model_dtype",),
        "the trainer's parameter dtype (auto: fp32, float32 -> fp32, ...); verl computes in "
        "fsdp_config.dtype (bf16/fp16 "
        "only) and rolls out in rollout.dtype, a gap algo.rollout_correction reports and can correct",
        _dtype,
    ),
    **{
        f"model.{key}": Knob(
            (), "none exists: `uniagent train` refuses it (a served model's setting)", subtree=key == "remote"
        )
        for key in NOT_TRAINED
    },
    "model.tool_format": Knob(
        (), "none exists: a trained policy's tool calls are text (model.template_tools renders them)"
    ),
    # -- tasks: one parquet directory per selection, written by `uniagent data prepare` -------------
    "tasks.spec": Knob(
        ("data.train_files", "data.val_files"),
        "the suite, prepared as parquet under data/verl/<selection> (every task trains, as locally; "
        "validation reads the same rows); the toy family is local only and refused",
        _tasks,
    ),
    "tasks.family": Knob(
        ("data.train_files",), "`uniagent data prepare --family` (part of the data dir)", _tasks
    ),
    "tasks.limit": Knob(
        ("data.train_files",), "`uniagent data prepare --limit` (part of the data dir)", _tasks
    ),
    "tasks.ids": Knob(("data.train_files",), "`uniagent data prepare --ids` (part of the data dir)", _tasks),
    # -- the episode: UniAgentLoop's settings (validated by settings.py before launch) -------------
    "agent": to_loop("agent", "agent", "who acts and every budget, +uniagent.agent.*", subtree=True),
    "sandbox": to_loop("sandbox", "sandbox", "the sandbox config, +uniagent.sandbox.*", subtree=True),
    # -- algorithm ---------------------------------------------------------------------------------
    "algo.adv_estimator": same("algorithm.adv_estimator", "same name"),
    "algo.norm_adv_by_std_in_grpo": same("algorithm.norm_adv_by_std_in_grpo", "same"),
    "algo.loss_mode": same(ACTOR + "policy_loss.loss_mode", "same name"),
    "algo.loss_agg_mode": same(ACTOR + "loss_agg_mode", "same name"),
    "algo.clip_ratio_low": same(ACTOR + "clip_ratio_low", "same"),
    "algo.clip_ratio_high": same(ACTOR + "clip_ratio_high", "same"),
    "algo.clip_ratio_c": same(ACTOR + "clip_ratio_c", "same"),
    "algo.kl_loss_coef": Knob(
        (ACTOR + "kl_loss_coef", ACTOR + "use_kl_loss"),
        "coef as is; use_kl_loss = coef > 0 (a reference model only then)",
        lambda c: {
            ACTOR + "kl_loss_coef": c.algo.kl_loss_coef,
            ACTOR + "use_kl_loss": c.algo.kl_loss_coef > 0,
        },
    ),
    "algo.kl_loss_type": same(ACTOR + "kl_loss_type", "same name"),
    "algo.rollout_correction": Knob(
        (
            "algorithm.rollout_correction.rollout_is",
            "algorithm.rollout_correction.rollout_is_threshold",
            "algorithm.rollout_correction.bypass_mode",
        ),
        "rollout_is as is; the threshold pair as verl's spec (upper, or 'lower_upper' for IcePop); "
        "bypass_mode (pi_old = the rollout's logprobs, as locally) when rollout_is is null and loss_mode is "
        "vanilla: verl's bypass mode swaps any other loss_mode for PPO-clip, so gspo & co. run decoupled "
        "(pi_old recomputed by the trainer), which in async mode no longer corrects for staleness: set "
        "rollout_is=token there",
        _rollout_correction,
        diverges=lambda c: _is_async(c) and not _bypass(c) and c.algo.rollout_correction.rollout_is is None,
        subtree=True,
    ),
    "algo.filter_groups.enable": Knob(
        ("algorithm.filter_groups.enable", "trainer.use_v1"),
        "same; only main_ppo's V1 trainer reads it, so enabled -> trainer.use_v1=True, which needs "
        "trainer.max_infra_failure_share=1.0 (the check's replay buffer has no group filter); refused in "
        "async mode (the fully-async trainer has none)",
        _filter_groups,
    ),
    "algo.filter_groups.metric": Knob(
        ("algorithm.filter_groups.metric",),
        "same names: reward is verl's canonical score, resolved comes from UniAgentLoop's reward_extra_info",
        _filter_groups,
    ),
    "algo.filter_groups.max_num_gen_batches": Knob(
        (),
        "local only: verl 0.9's V1 trainer ignores algorithm.filter_groups.max_num_gen_batches (it logs "
        "so) and refills dropped groups until the batch is full; its max_inflight_gen_batches bounds "
        "concurrency, not a total",
        diverges=lambda c: c.algo.filter_groups.enable and c.algo.filter_groups.max_num_gen_batches > 0,
    ),
    "algo.overlong_filter": to_loop(
        "overlong_filter",
        "algo.overlong_filter",
        "UniAgentLoop gives a cut episode an all-zero mask and keeps its reward in its group: the same "
        "baseline and gradient as locally (verl's own nearest, DAPO's overlong buffer, is a length penalty "
        "in the reward instead); under seq-mean-* aggregation verl still counts the masked row",
    ),
    "algo.unfinished": Knob(
        (LOOP + "unfinished",),
        "count and baseline_only as UniAgentLoop's `unfinished` (baseline_only: an all-zero mask, the reward "
        "stays in the group); drop has no counterpart (verl's group is every sample of its prompt), so it "
        "is refused",
        lambda c: {LOOP + "unfinished": _unfinished(c)},
    ),
    # -- optimiser ---------------------------------------------------------------------------------
    "optim.lr": same(ACTOR + "optim.lr", "same"),
    "optim.weight_decay": same(ACTOR + "optim.weight_decay", "same (verl's default is 0.01)"),
    "optim.betas": same(ACTOR + "optim.betas", "same"),
    "optim.grad_clip": same(ACTOR + "optim.clip_grad", "max global grad norm"),
    # -- trainer -----------------------------------------------------------------------------------
    "trainer.steps": Knob(
        ("trainer.total_training_steps", "trainer.total_epochs", "rollout.total_rollout_steps"),
        "sync: total_training_steps; async: rollout.total_rollout_steps = steps * tasks_per_step prompts "
        "(verl derives the trainer's steps from it); total_epochs = steps, an upper bound",
        _steps,
    ),
    "trainer.group_size": Knob(
        ("actor_rollout_ref.rollout.n", "rollout.n"),
        "samples per prompt (async sets both, as verl reads both)",
        _group_size,
    ),
    "trainer.tasks_per_step": Knob(
        (
            "data.train_batch_size",
            "data.gen_batch_size",
            ACTOR + "ppo_mini_batch_size",
            "async_training.require_batches",
        ),
        "prompts per step = one mini-batch (one optimizer step, as locally); async: prompts stream one "
        "by one (train_batch_size=0, gen_batch_size=1) and a step takes require_batches=1 mini-batch",
        _tasks_per_step,
    ),
    "trainer.micro_batch_size": Knob(
        (),
        "local only: a memory knob (the loss is aggregated over the whole step either way); verl sizes "
        "micro-batches per GPU (use_dynamic_bsz, ppo_max_token_len_per_gpu)",
    ),
    "trainer.concurrency": Knob(
        (),
        "local only: episodes at once on this machine; verl runs a batch's samples across "
        "rollout.agent.num_workers workers (async: async_training.concurrent_samples_per_replica each)",
    ),
    "trainer.output": Knob(
        ("trainer.default_local_dir", "trainer.experiment_name"),
        "OUTPUT/checkpoints (metrics: OUTPUT/metrics.jsonl); the run name",
        _output,
    ),
    "trainer.save_every": Knob(
        ("trainer.save_freq",),
        "same; 0 (only at the end) -> steps",
        lambda c: {"trainer.save_freq": c.trainer.save_every or c.trainer.steps},
    ),
    "trainer.keep_checkpoints": same("trainer.max_actor_ckpt_to_keep", "same"),
    "trainer.seed": Knob(
        ("data.seed", ROLLOUT + "seed"),
        "the task order's shuffle and the sampling seed",
        lambda c: {"data.seed": c.trainer.seed, ROLLOUT + "seed": c.trainer.seed},
    ),
    "trainer.tensorboard": Knob(
        ("trainer.logger",), "file (metrics.jsonl), tensorboard in trainer.logger", _logger
    ),
    "trainer.wandb_project": Knob(
        ("trainer.logger", "trainer.project_name"), "wandb in trainer.logger; project_name", _logger
    ),
    "trainer.max_infra_failure_share": to_loop(
        "max_infra_failure_share",
        "trainer.max_infra_failure_share",
        "UniAgentLoop's step check (needs verl's legacy trainer, see launch.py)",
    ),
    "trainer.mode": Knob((), "the entry point (ENTRY_FOR_MODE): sync -> main_ppo, async -> fully_async_main"),
    "trainer.max_staleness": Knob(
        ("async_training.staleness_threshold", "async_training.trigger_parameter_sync_step"),
        "async: staleness_threshold = max_staleness with trigger_parameter_sync_step=1 (a verl "
        "version is then one optimizer step; see the module docstring); sync: unused, as locally. The "
        "start bound is the same; verl does not also drop a group that finished later than that",
        _staleness,
    ),
    "trainer.partial_rollout": Knob(
        ("async_training.partial_rollout",),
        "same (async only)",
        lambda c: {"async_training.partial_rollout": c.trainer.partial_rollout} if _is_async(c) else {},
    ),
    "trainer.kv_on_update": Knob(
        (),
        "local only: verl's partial rollout resumes an aborted request by prefilling it again under the "
        "new weights (recompute); keep is PipelineRL's in-flight update, which verl's servers do not offer",
    ),
    "trainer.engine_threads": Knob(
        (), "local only: CPU threads; verl gives rollouts their own GPUs (rollout.n_gpus_per_node)"
    ),
    "trainer.trainer_threads": Knob(
        (), "local only: CPU threads; verl gives the trainer its own GPUs (trainer.n_gpus_per_node)"
    ),
}


def knob_for(path: str) -> Knob | None:
    """The knob for a dotted TrainConfig path: its own entry, or the subtree entry above it."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        knob = KNOBS.get(".".join(parts[:n]))
        if knob is not None and (n == len(parts) or knob.subtree):
            return knob
    return None
