"""Every local-trainer setting mapped to verl (`integrations/verl/keys.py`), checked against verl's real
config and code; `uniagent train --engine verl --config LOCAL.yaml`; the multi-turn recipes agree
with the mapping for the values the local configs set.

verl's hydra configs are composed strictly (an unknown key fails), the staleness conversion runs
verl's own `FullyAsyncRollouter` methods (on a stand-in `self`: the actor itself needs Ray and GPUs),
and the sync translation passes verl's `validate_config`. No GPU is needed.
"""

from __future__ import annotations

import asyncio
import re
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from conftest import require_module
from uniagent.errors import ConfigError
from uniagent.integrations.verl import keys
from uniagent.integrations.verl.launch import available_recipes, build_command, load_recipe, resolve_overrides
from uniagent.integrations.verl.local_config import (
    BASE_RECIPE,
    from_local_config,
    is_local_config,
    names_local_field,
    override,
    translate,
)
from uniagent.integrations.verl.settings import UniAgentLoopSettings
from uniagent.train.config import TrainConfig, TrainerSection, build_train_config
from verl_helpers import printed_command

verl = require_module("verl", "verl is the training backend (pip install -e .[verl])")

from omegaconf import OmegaConf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
from test_verl_data import compose_for  # noqa: E402  (one composer of verl's real config)


def leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every settable dotted path of `model`: fields of nested models, dict fields as one leaf."""
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += leaf_paths(ann, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def unmapped(model: type[BaseModel]) -> list[str]:
    """Fields with neither verl keys nor a reason."""
    missing = []
    for path in leaf_paths(model):
        knob = keys.knob_for(path)
        if knob is None or not (knob.keys or knob.why.strip()):
            missing.append(path)
    return missing


# -- 1. the mapping --------------------------------------------------------------------------------
def test_every_train_config_field_has_a_verl_key_or_a_reason() -> None:
    assert unmapped(TrainConfig) == []
    for path, knob in keys.KNOBS.items():  # no entry for a field that is gone
        assert path in leaf_paths(TrainConfig) or knob.subtree, path
        if not knob.keys:
            assert knob.why.startswith(("local only", "none exists", "the entry point", "the base recipe")), (
                path
            )

    # the negative control: a knob added to TrainConfig without a mapping is caught
    class NewTrainer(TrainerSection):
        brand_new_knob: int = 1

    class NewConfig(TrainConfig):
        trainer: NewTrainer = Field(default_factory=NewTrainer)

    assert unmapped(NewConfig) == ["trainer.brand_new_knob"]


def test_every_mapped_key_exists_in_verls_config_or_the_agent_loop_settings() -> None:
    sync = compose_for(["python", "-m", keys.SYNC_ENTRY])
    fully_async = compose_for(["python", "-m", keys.ASYNC_ENTRY])
    missing = object()
    for path, knob in keys.KNOBS.items():
        for key in knob.keys:
            if key.startswith(keys.LOOP):
                assert key.split(".")[1] in UniAgentLoopSettings.model_fields, (path, key)
                continue
            in_async = OmegaConf.select(fully_async, key, default=missing) is not missing
            assert in_async, f"{path} -> {key}: not in verl's fully-async config"
            if not key.startswith(("async_training.", "rollout.")):
                assert OmegaConf.select(sync, key, default=missing) is not missing, (path, key)
    # and each mode's translation sets only keys its entry point has (checked by strict composition below)


def _config(mode: str, device: str = "cuda", **sets: Any) -> TrainConfig:
    """A local config for the GPU recipes unless `device` says cpu (model.device picks the base recipe)."""
    items = ["tasks.spec=builtin:starter", f"trainer.mode={mode}", f"model.device={device}"]
    items += [f"{k}={v}" for k, v in sets.items()]
    return build_train_config(None, items)


NON_DEFAULT = {
    "model.temperature": 0.7,
    "model.max_tokens": 48,
    "agent.max_turns": 4,
    "agent.context.keep_turns": 3,
    "algo.loss_mode": "gspo",
    "algo.loss_agg_mode": "seq-mean-token-mean",
    "algo.clip_ratio_low": 0.0003,
    "algo.kl_loss_coef": 0.01,
    "algo.rollout_correction.rollout_is": "token",
    "algo.rollout_correction.rollout_is_threshold": 3.0,
    "algo.rollout_correction.rollout_is_threshold_lower": 0.5,
    "optim.lr": 3.0e-5,
    "optim.betas": "[0.8,0.95]",
    "trainer.steps": 12,
    "trainer.group_size": 6,
    "trainer.tasks_per_step": 3,
    "trainer.save_every": 0,
    "trainer.wandb_project": "uni-test",
    "trainer.max_staleness": 2,
    "trainer.partial_rollout": "false",
}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_local_config_composes_in_verl_with_every_value_converted(mode: str, tmp_path: Path) -> None:
    """The translation of a config with non-default values, laid over the mode's base recipe, composes
    strictly in verl's config for that entry point and holds each converted value."""
    cfg = _config(mode, **NON_DEFAULT)
    translation = translate(cfg)
    assert (
        translation.entrypoint == keys.ENTRY_FOR_MODE[mode]
        and translation.recipe == BASE_RECIPE[mode, "cuda"]
    )
    command = build_command(translation.recipe, translation.overrides)
    c = compose_for(command)
    actor, rollout = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    assert c.actor_rollout_ref.model.path == keys.HUB_SMOLLM2
    assert rollout.temperature == 0.7 and rollout.n == 6
    assert actor.policy_loss.loss_mode == "gspo" and actor.loss_agg_mode == "seq-mean-token-mean"
    assert actor.clip_ratio_low == 0.0003 and actor.use_kl_loss is True and actor.kl_loss_coef == 0.01
    assert (
        actor.optim.lr == 3.0e-5 and list(actor.optim.betas) == [0.8, 0.95] and actor.optim.weight_decay == 0
    )
    assert actor.ppo_mini_batch_size == 3
    corr = c.algorithm.rollout_correction
    assert corr.rollout_is == "token" and corr.rollout_is_threshold == "0.5_3.0" and corr.bypass_mode is False
    assert (
        list(c.trainer.logger) == ["console", "file", "tensorboard", "wandb"]
        and c.trainer.project_name == "uni-test"
    )
    assert c.trainer.save_freq == 12 and c.trainer.total_epochs == 12
    assert c.uniagent.agent.max_turns == 4 and c.uniagent.agent.context.keep_turns == 3
    assert c.uniagent.agent.context.policy == "none" and c.uniagent.agent.max_context_tokens is None
    assert c.uniagent.model.max_tokens == 48 and c.uniagent.sandbox.type == "local"
    assert c.data.train_files == c.data.val_files == "data/verl/starter/train.parquet"
    if mode == "sync":
        from verl.trainer.main_ppo import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        assert c.data.train_batch_size == 3 and c.trainer.total_training_steps == 12
        assert "async_training" not in c
        validate_config(c, use_reference_policy=need_reference_policy(c), use_critic=need_critic(c))
    else:
        assert c.rollout.n == 6 and c.rollout.total_rollout_steps == 36  # 12 steps x 3 prompts
        assert c.data.train_batch_size == 0 and c.data.gen_batch_size == 1
        assert c.async_training.staleness_threshold == 2.0 and c.async_training.partial_rollout is False
        assert c.async_training.trigger_parameter_sync_step == 1 and c.async_training.require_batches == 1
        assert rollout.multi_turn.enable is True  # else verl swaps UniAgentLoop for single_turn_agent


def _rollouter_bound(composed) -> tuple[int, Any]:
    """verl's own `set_max_required_samples` and `_should_pause_generation` on a stand-in `self` built
    the way `FullyAsyncRollouter.__init__` builds those fields from the config."""
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter

    cls = FullyAsyncRollouter.__ray_metadata__.modified_class
    at = composed.async_training
    me = types.SimpleNamespace(
        config=composed,
        lock=None,
        staleness_threshold=at.get("staleness_threshold", 1),
        required_samples=composed.actor_rollout_ref.actor.ppo_mini_batch_size * at.require_batches,
        total_rollout_steps=composed.rollout.total_rollout_steps,
        llm_server_manager=types.SimpleNamespace(get_active_server_count=lambda: 64),
        concurrent_samples_per_replica=at.concurrent_samples_per_replica,
        _active_count_history=[(0.0, 0, 0)],
        paused=True,
    )

    async def run() -> int:
        me.lock = asyncio.Lock()
        await cls.set_max_required_samples(me)
        return me.max_required_samples

    bound = asyncio.run(run())

    def pauses(started_since_sync: int) -> bool:
        async def queue_stats():
            return {"queue_size": 0}

        me.message_queue_client = types.SimpleNamespace(get_statistics=queue_stats)
        me.staleness_samples = started_since_sync
        return asyncio.run(cls._should_pause_generation(me))

    return bound, pauses


@pytest.mark.parametrize(("max_staleness", "tasks_per_step"), [(0, 4), (1, 3), (3, 2)])
def test_max_staleness_is_verls_staleness_threshold_in_versions(
    max_staleness: int, tasks_per_step: int
) -> None:
    """Locally a group may start while started - version * tasks_per_step < (max_staleness + 1) *
    tasks_per_step. verl's rollouter, run on the translated config, allows exactly as many prompts
    outstanding before it pauses, and a verl version is one optimizer step (sync every step)."""
    cfg = _config(
        "async", **{"trainer.max_staleness": max_staleness, "trainer.tasks_per_step": tasks_per_step}
    )
    composed = compose_for(build_command(BASE_RECIPE["async", "cuda"], translate(cfg).overrides))
    bound, pauses = _rollouter_bound(composed)
    local_bound = (max_staleness + 1) * tasks_per_step
    assert bound == local_bound
    assert not pauses(local_bound - 1) and pauses(local_bound)
    assert composed.async_training.trigger_parameter_sync_step == 1


def test_knobs_verl_cannot_follow_are_refused_or_reported(caplog, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fully-async trainer has no dynamic sampling"):
        translate(_config("async", **{"algo.filter_groups.enable": "true"}))
    with pytest.raises(ConfigError, match=r"max_infra_failure_share=1\.0"):
        translate(_config("sync", **{"algo.filter_groups.enable": "true"}))
    on = translate(
        _config("sync", **{"algo.filter_groups.enable": "true", "trainer.max_infra_failure_share": 1.0})
    )
    assert on.values["trainer.use_v1"] is True and on.values["algorithm.filter_groups.enable"] is True
    build_command(on.recipe, on.overrides)  # V1 with the check off is allowed
    assert on.dropped[0].startswith("algo.filter_groups.max_num_gen_batches=10")  # V1 ignores it
    assert translate(_config("sync")).dropped == []
    filters = translate(
        _config("sync", **{"algo.overlong_filter": "true", "algo.unfinished": "baseline_only"})
    )
    assert filters.values["uniagent.overlong_filter"] is True
    assert filters.values["uniagent.unfinished"] == "baseline_only" and filters.dropped == []
    with pytest.raises(ConfigError, match="unfinished=drop"):
        translate(_config("sync", **{"algo.unfinished": "drop"}))
    with pytest.raises(ConfigError, match="toy family"):
        translate(build_train_config(None, []))
    with pytest.raises(ConfigError, match="gguf"):
        translate(_config("sync", **{"model.spec": str(tmp_path / "m.gguf")}))


def test_bypass_mode_only_where_verl_keeps_the_loss_mode() -> None:
    """verl's bypass mode (pi_old = the rollout's logprobs, what the local trainer does) swaps the
    configured loss for its own PPO-clip, as verl's `apply_bypass_mode` shows on a real batch; so only
    vanilla translates to bypass, other losses run decoupled, and in async mode without IS weights
    (no staleness correction then) the translation says so."""
    import torch
    from verl import DataProto
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    loss = OmegaConf.create({"loss_mode": "gspo"})
    batch = DataProto.from_dict(tensors={"rollout_log_probs": torch.zeros(1, 2)})
    apply_bypass_mode(batch, OmegaConf.create({"bypass_mode": True}), loss)
    assert loss.loss_mode == "bypass_mode"

    def bypass(mode: str, **sets: Any) -> tuple[bool, list[str]]:
        t = translate(_config(mode, **sets))
        return t.values["algorithm.rollout_correction.bypass_mode"], t.dropped

    assert bypass("async") == (True, [])
    assert bypass("sync", **{"algo.loss_mode": "gspo"}) == (False, [])
    off, dropped = bypass("async", **{"algo.loss_mode": "gspo"})
    assert not off and dropped[0].startswith("algo.rollout_correction=")
    assert bypass("async", **{"algo.loss_mode": "gspo", "algo.rollout_correction.rollout_is": "token"}) == (
        False,
        [],
    )


def test_hydra_values_round_trip() -> None:
    assert override("a.b", None) == "a.b=null" and override("a.b", [0.9, 0.999]) == "a.b=[0.9,0.999]"
    assert override("uniagent.x", "none") == "+uniagent.x=none"
    assert override("a.b", "0.5_2.0") == "a.b='0.5_2.0'" and override("a.b", "true") == "a.b='true'"
    assert names_local_field("trainer.steps=3") and names_local_field("sandbox.image=x")
    assert names_local_field("agent.context.policy=window")
    assert not names_local_field("trainer.n_gpus_per_node=4") and not names_local_field("+uniagent.a=1")
    assert not names_local_field("model@=x") and not names_local_field("trainer.steps.x=1")
    assert names_local_field("agent.max_turnz=1")  # a local section: validation names the typo


def test_a_sandbox_of_another_type_replaces_the_agent_loop_entrys() -> None:
    """The `uniagent:` section reaches every agent-loop entry; a local config's `sandbox: {type: local}`
    over the SWE entry's container sandbox replaces it (merging would keep `runtime`, which a local
    sandbox refuses), while a section of the same type still merges key by key."""
    from uniagent.integrations.verl.settings import merge_settings

    swe = {"sandbox": {"type": "container", "runtime": "docker"}, "agent": {"max_turns": 50}}
    merged = merge_settings(swe, {"sandbox": {"type": "local"}, "agent": {"timeout_budget": 2}})
    assert merged == {"sandbox": {"type": "local"}, "agent": {"max_turns": 50, "timeout_budget": 2}}
    same = merge_settings(swe, {"sandbox": {"runtime": "podman"}})
    assert same["sandbox"] == {"type": "container", "runtime": "podman"}


# -- 2. uniagent train --engine verl --config LOCAL.yaml ----------------------------------------------
def _write_local(tmp_path: Path, mode: str = "sync") -> Path:
    path = tmp_path / "local.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"spec": "local", "temperature": 0.7, "device": "cuda"},
                "tasks": {"spec": "builtin:starter", "limit": 4},
                "agent": {"max_turns": 3},
                "trainer": {"mode": mode, "steps": 5, "tasks_per_step": 2, "group_size": 4},
            }
        )
    )
    return path


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cli_train_engine_verl_takes_a_local_config(mode: str, tmp_path: Path) -> None:
    from uniagent.cli import app

    local = _write_local(tmp_path, mode)
    assert is_local_config(local) and not is_local_config(load_recipe("starter_grpo")["path"])
    args = ["train", "--engine", "verl", "--config", str(local), "--print"]
    sets = ["--set", "trainer.steps=7", "--set", "trainer.n_gpus_per_node=2"]
    result = CliRunner().invoke(app, [*args, *sets])
    assert result.exit_code == 0, result.output
    env, printed = printed_command(result.output)
    assert printed[1:3] == ["-m", keys.ENTRY_FOR_MODE[mode]]
    # verl's file logger writes the run's metrics into trainer.output, beside its checkpoints
    assert env["VERL_FILE_LOGGER_PATH"] == str(Path("runs/train/metrics.jsonl").resolve())
    assert any(item.startswith("trainer.logger=[console,file") for item in printed)
    assert env["VERL_USE_EXTERNAL_MODULES"] == "uniagent.integrations.verl.plugin"
    overrides = printed[3:]
    assert (
        "+uniagent.agent.max_turns=3" in overrides
        and "actor_rollout_ref.rollout.temperature=0.7" in overrides
    )
    assert "trainer.n_gpus_per_node=2" in overrides  # a verl key given with --set wins
    assert "actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct" in overrides
    steps = "trainer.total_training_steps=7" if mode == "sync" else "rollout.total_rollout_steps=14"
    assert steps in overrides  # a local key given with --set changed the local config first
    assert "data.train_files=data/verl/starter-limit4/train.parquet" in overrides
    assert printed == build_command(
        local, ["trainer.steps=7", "trainer.n_gpus_per_node=2", "model@=/models/x"]
    )
    compose_for(printed)
    # the recipe path keeps working
    result = CliRunner().invoke(app, ["train", "--engine", "verl", "--config", "starter_grpo", "--print"])
    assert result.exit_code == 0 and printed_command(result.output)[1] == build_command("starter_grpo", [])


def test_a_bad_local_key_is_a_config_error_naming_it(tmp_path: Path) -> None:
    local = _write_local(tmp_path)
    with pytest.raises(ConfigError, match="max_turnz"):
        build_command(local, ["agent.max_turnz=3"])
    with pytest.raises(ConfigError, match="staleness"):
        build_command(local, ["trainer.max_staleness=-1"])


def test_launch_prepares_the_local_configs_data_first(tmp_path: Path, monkeypatch) -> None:
    """`launch` writes the tasks as verl parquet where the translation points, then runs verl (here
    hydra's `--cfg job`, which prints the composed config and exits: no GPU needed)."""
    import pandas as pd

    from uniagent.integrations.verl.launch import launch

    local = _write_local(tmp_path)
    monkeypatch.chdir(tmp_path)
    earlier = (
        tmp_path / "runs/train/metrics.jsonl"
    )  # a run's metrics: hydra's --cfg runs nothing, so they stay
    earlier.parent.mkdir(parents=True)
    earlier.write_text('{"step": 1, "data": {}}\n')
    code = launch(local, ["--cfg", "job", "--package", "data"])
    assert code == 0 and earlier.read_text() == '{"step": 1, "data": {}}\n'
    frame = pd.read_parquet(tmp_path / "data/verl/starter-limit4/train.parquet")
    assert len(frame) == 4 and not (tmp_path / "data/verl/starter-limit4/val.parquet").exists()


def test_data_prepare_takes_the_local_configs_task_ids(tmp_path: Path) -> None:
    """`tasks.ids` reaches verl through `uniagent data prepare --id` (the command `--print` names)."""
    import pandas as pd

    from uniagent.cli import app
    from uniagent.integrations.verl.local_config import prepare_command

    cfg = build_train_config(None, ["tasks.spec=builtin:starter", "tasks.ids=[slugger-001,textkit-001]"])
    command = prepare_command(cfg)
    assert command[:3] == ["uniagent", "data", "prepare"] and command.count("--id") == 2
    command[command.index("--output") + 1] = str(tmp_path)
    result = CliRunner().invoke(app, command[1:])
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(tmp_path / "train.parquet")
    assert sorted(frame["extra_info"].map(lambda e: e["instance_id"])) == ["slugger-001", "textkit-001"]


# -- 3. the multi-turn recipes agree with the mapping ------------------------------------------------
LINE = re.compile(r"^\s*-\s*(?P<override>\S+)\s*(?:#\s*local:\s*(?P<local>\S+))?")


def recipe_comments(path: str) -> dict[str, str | None]:
    """override key -> the local key its `# local:` comment names (None: no comment)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        m = LINE.match(line)
        if m:
            out[m["override"].split("=", 1)[0].lstrip("+")] = m["local"]
    return out


def test_multiturn_recipes_agree_with_the_mapping_for_the_local_configs() -> None:
    twins = [n for n in available_recipes() if load_recipe(n).get("local_config")]
    assert set(BASE_RECIPE.values()) <= set(twins)
    for name in twins:
        recipe = load_recipe(name)
        local = ROOT / recipe["local_config"]
        assert local.is_file(), f"{name}: local_config {local} is missing"
        translation, rest = from_local_config(local, list(recipe.get("local_set") or []))
        assert rest == [] and translation.entrypoint == recipe["entrypoint"], name
        resolved = {o.split("=", 1)[0].lstrip("+"): o for o in resolve_overrides(recipe, [])}
        comments = recipe_comments(recipe["path"])
        for key, value in translation.values.items():
            expected = resolve_overrides({**recipe, "overrides": [override(key, value)]}, [])[0]
            assert resolved.get(key) == expected, f"{name}: {key} (from {translation.sources[key]})"
            named = comments.get(key)
            assert named is not None, f"{name}: {key} carries no `# local:` comment"
            path = _knob_path(named)
            assert key in keys.KNOBS[path].values(translation.cfg, path), f"{name}: {key} is not {named}'s"
        for key, named in comments.items():  # a comment on a line the mapping does not make is stale
            assert named is None or key in translation.values, f"{name}: {key} says local: {named}"
        # the recipe and the local config launch the same command (hydra overrides in any order)
        ours, theirs = build_command(name, []), build_command(local, list(recipe.get("local_set") or []))
        assert ours[:3] == theirs[:3] and sorted(ours[3:]) == sorted(theirs[3:]), name


def _knob_path(path: str) -> str:
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in keys.KNOBS:
            return ".".join(parts[:n])
    raise AssertionError(path)


# -- 4. the device picks the base recipe: cpu runs verl's CPU plugin --------------------------------
def test_train_multiturn_on_verl_picks_the_cpu_recipe_with_its_environment() -> None:
    """`uniagent train --engine verl --config configs/train_multiturn.yaml` on its default device (cpu)
    prints the CPU twin's command: the plugin's environment in front, the packaged SmolLM2 as Hugging
    Face directories, the uniagent_local rollout; verl's own config composes it. `model.device=cuda`
    gives the GPU twin (vLLM, the Hub's SmolLM2), with no environment."""
    from uniagent.cli import app

    args = ["train", "--engine", "verl", "--config", str(ROOT / "configs/train_multiturn.yaml"), "--print"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    env, command = printed_command(result.output)
    assert (
        env["VERL_PLATFORM"] == "cpu" and "uniagent.integrations.verl.cpu" in env["VERL_USE_EXTERNAL_MODULES"]
    )
    assert env["OMP_NUM_THREADS"].isdigit()
    assert command[1:3] == ["-m", keys.SYNC_ENTRY]
    c = compose_for(command)
    assert c.actor_rollout_ref.rollout.name == "uniagent_local" and c.trainer.device == "cpu"
    assert (Path(c.actor_rollout_ref.model.path) / "config.json").is_file()
    assert (Path(c.actor_rollout_ref.model.tokenizer_path) / "tokenizer_config.json").is_file()
    assert c.actor_rollout_ref.rollout.n == 4 and c.trainer.total_training_steps == 20  # the local config's

    gpu = CliRunner().invoke(app, [*args, "--set", "model.device=cuda"])
    assert gpu.exit_code == 0, gpu.output
    command = printed_command(gpu.output)[1]
    assert command[1:3] == ["-m", keys.SYNC_ENTRY] and "actor_rollout_ref.rollout.name=vllm" in command
    assert f"actor_rollout_ref.model.path={keys.HUB_SMOLLM2}" in command


def test_train_multiturn_async_on_verl_picks_the_cpu_fully_async_twin() -> None:
    """`trainer.mode=async` on cpu: fully_async_main over multiturn_grpo_fully_async_cpu, the plugin's
    environment in front, the local config's objective (not the GSPO recipe's), and a model directory
    that also holds the tokenizer (fully_async_main reads it from model.path)."""
    from uniagent.cli import app

    config = str(ROOT / "configs/train_multiturn.yaml")
    args = ["train", "--engine", "verl", "--config", config, "--set", "trainer.mode=async", "--print"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    env, command = printed_command(result.output)
    assert env["VERL_PLATFORM"] == "cpu" and env["OMP_NUM_THREADS"].isdigit()
    assert command[1:3] == ["-m", keys.ASYNC_ENTRY]
    c = compose_for(command)
    assert c.actor_rollout_ref.rollout.name == "uniagent_local" and c.trainer.device == "cpu"
    assert c.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    assert c.async_training.partial_rollout is True and c.actor_rollout_ref.rollout.n == 4
    assert (Path(c.actor_rollout_ref.model.path) / "tokenizer_config.json").is_file()


def test_a_recipes_module_list_joins_the_callers_and_other_variables_are_the_recipes() -> None:
    from uniagent.integrations.verl.launch import PLUGIN, recipe_env

    recipe = {
        "env": {"VERL_USE_EXTERNAL_MODULES": "a.b", "VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "{cpus}"}
    }
    env = recipe_env(recipe, {"VERL_USE_EXTERNAL_MODULES": "mine,a.b", "VERL_PLATFORM": "cuda"})
    # every command also loads uniagent's own plugin (its step metrics), after the recipe's modules
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"a.b,{PLUGIN},mine" and env["VERL_PLATFORM"] == "cpu"
    assert int(env["OMP_NUM_THREADS"]) >= 1
    assert recipe_env(recipe, {})["VERL_USE_EXTERNAL_MODULES"] == f"a.b,{PLUGIN}"
    assert recipe_env({}, {})["VERL_USE_EXTERNAL_MODULES"] == PLUGIN
    with pytest.raises(ConfigError, match=r"model\.device"):
        build_command(str(ROOT / "configs/train_multiturn.yaml"), ["model.device=tpu"])
