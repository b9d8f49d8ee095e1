"""`uniagent data prepare` and the verl launch recipes, checked against verl's real classes.

The parquet files are read by verl's own `RLHFDataset`; every recipe is composed against verl's own
hydra configs (strict: an unknown key fails) and the synchronous ones pass verl's `validate_config`;
one recipe is launched through verl's real entry point with hydra's `--cfg job` (prints the final
config and exits, so no GPU is needed).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from agent_helpers import make_swe_task_file
from conftest import require_module
from uniagent.errors import ConfigError
from uniagent.integrations.verl.data import COLUMNS, prepare
from uniagent.integrations.verl.launch import (
    AGENT_LOOP_YAML,
    PLUGIN,
    available_recipes,
    build_command,
    launch,
    load_recipe,
    run_verl,
)
from uniagent.integrations.verl.spec import spec_from_extra_info, task_from_spec
from uniagent.tasks import load_tasks
from verl_helpers import printed_command

verl = require_module("verl", "verl is the training backend (pip install -e .[verl])")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

VERL_DIR = Path(verl.__file__).parent
CONFIGS = {
    "verl.trainer.main_ppo": (VERL_DIR / "trainer" / "config", "ppo_trainer"),
    "verl.experimental.fully_async_policy.fully_async_main": (
        VERL_DIR / "experimental" / "fully_async_policy" / "config",
        "fully_async_ppo_trainer",
    ),
}


def compose_for(command: list[str]):
    config_dir, name = CONFIGS[command[2]]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return compose(config_name=name, overrides=command[3:])
    finally:
        GlobalHydra.instance().clear()


@pytest.fixture(scope="module")
def verl_tokenizer(smol_tokenizer):
    from verl.utils.tokenizer.tokenizer import set_pad_token_id

    tok = copy.deepcopy(smol_tokenizer)
    set_pad_token_id(tok)
    return tok


# -- data prepare -------------------------------------------------------------------------------------
def test_prepare_starter_split_and_columns(tmp_path: Path) -> None:
    report = prepare("builtin:starter", tmp_path / "a", val_size=4, seed=7)
    assert (report["n_train"], report["n_val"]) == (14, 4)
    train = pd.read_parquet(report["train"])
    val = pd.read_parquet(report["val"])
    assert tuple(train.columns) == COLUMNS
    ids = lambda df: [e["instance_id"] for e in df["extra_info"]]  # noqa: E731
    assert not set(ids(train)) & set(ids(val))
    assert sorted(ids(train) + ids(val)) == sorted(t.instance_id for t in load_tasks("builtin:starter"))
    assert set(train["agent_name"]) == {"uniagent"} and set(train["data_source"]) == {"uniagent/swe"}
    indices = [e["index"] for e in train["extra_info"]] + [e["index"] for e in val["extra_info"]]
    assert sorted(indices) == list(range(18)), "index groups the n samples of one prompt in verl"
    # the same seed gives the same split; another seed another one
    again = prepare("builtin:starter", tmp_path / "b", val_size=4, seed=7)
    assert ids(pd.read_parquet(again["val"])) == ids(val)
    other = prepare("builtin:starter", tmp_path / "c", val_size=4, seed=8)
    assert ids(pd.read_parquet(other["val"])) != ids(val)
    # fraction: at least one validation row; a split leaving nothing to train is refused
    assert prepare("builtin:starter", tmp_path / "d", val_fraction=0.01)["n_val"] == 1
    with pytest.raises(ConfigError, match="none to train"):
        prepare("builtin:starter", tmp_path / "e", val_size=18)


def test_rows_rebuild_the_same_tasks_through_verls_dataset(tmp_path: Path, verl_tokenizer) -> None:
    """RLHFDataset reads the parquet; each row's spec rebuilds the Task `uniagent run` would load."""
    from omegaconf import OmegaConf

    report = prepare("builtin:starter", tmp_path, val_size=2, seed=0)
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 4096,
            "filter_overlong_prompts": True,
            "return_raw_chat": True,
        }
    )
    dataset = RLHFDataset([report["train"]], verl_tokenizer, config)
    assert len(dataset) == 16
    tasks = {t.instance_id: t for t in load_tasks("builtin:starter")}
    for i in range(len(dataset)):
        row = dataset[i]
        spec = spec_from_extra_info(row["extra_info"])
        assert spec["source"] == "builtin:starter", "bundled suites travel by name, not by path"
        task = task_from_spec(spec)
        want = tasks[task.instance_id]
        assert type(task) is type(want) and task.row == want.row and task.source == want.source
        assert list(row["raw_prompt"]) == want.messages()
        assert row["agent_name"] == "uniagent" and row["index"] == row["extra_info"]["index"]


def test_task_file_source_resolves_from_anywhere(tmp_path: Path, monkeypatch) -> None:
    path = make_swe_task_file(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    report = prepare(os.path.relpath(path, tmp_path), tmp_path / "out", val_size=0, agent_name="uniagent_swe")
    assert report["n_val"] == 0 and report["val"] is None
    row = pd.read_parquet(report["train"]).iloc[0]
    assert row["agent_name"] == "uniagent_swe"
    spec = json.loads(row["extra_info"]["uniagent_task"])
    assert spec["source"] == str(path.resolve())
    monkeypatch.chdir("/")
    task = task_from_spec(spec)
    assert task.repo_path() == (tmp_path / "src" / "repos" / "calc-001").resolve()


def test_cli_data_prepare_and_verl_command(tmp_path: Path) -> None:
    from uniagent.cli import app

    runner = CliRunner()
    result = runner.invoke(
        app, ["data", "prepare", "--tasks", "builtin:starter", "--output", str(tmp_path), "--seed", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "train: 16 rows" in result.output and (tmp_path / "val.parquet").exists()
    result = runner.invoke(app, ["verl", "command", "starter_gspo_fully_async", "trainer.total_epochs=1"])
    assert result.exit_code == 0, result.output
    env, printed = printed_command(result.output)
    assert printed == build_command("starter_gspo_fully_async", ["trainer.total_epochs=1"])
    assert env == {"VERL_USE_EXTERNAL_MODULES": PLUGIN}  # every command loads uniagent's step metrics
    result = runner.invoke(app, ["verl", "recipes"])
    assert result.exit_code == 0 and "starter_grpo" in result.output


# -- recipes ------------------------------------------------------------------------------------------
def test_every_recipe_composes_against_verls_config() -> None:
    from verl.trainer.main_ppo import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    names = available_recipes()
    assert {
        "starter_grpo",
        "starter_gspo",
        "starter_gspo_fully_async",
        "swe_grpo",
        "swe_gspo",
        "swe_gspo_fully_async",
        "multiturn_grpo",
        "multiturn_grpo_fully_async",
        "multiturn_grpo_cpu",
        "multiturn_gspo_fully_async_cpu",
    } <= set(names)
    for name in names:
        command = build_command(name, [])
        cfg = compose_for(command)  # strict: a key verl does not have fails here
        rollout = cfg.actor_rollout_ref.rollout
        assert rollout.agent.agent_loop_config_path == str(AGENT_LOOP_YAML)
        assert rollout.calculate_log_probs is True
        assert cfg.algorithm.adv_estimator == "grpo"
        assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == ("gspo" if "gspo" in name else "vanilla")
        if "fully_async" in name:
            assert command[2] == "verl.experimental.fully_async_policy.fully_async_main"
            assert cfg.async_training.partial_rollout is True
            assert cfg.actor_rollout_ref.actor.use_rollout_log_probs is True
            # else verl's rollouter runs single_turn_agent for every row, never UniAgentLoop
            assert rollout.multi_turn.enable is True
        else:
            assert command[2] == "verl.trainer.main_ppo"
            validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        if cfg.actor_rollout_ref.actor.policy_loss.loss_mode != "vanilla":
            # verl's bypass mode would swap the loss for PPO-clip (rollout_corr_helper.apply_bypass_mode)
            assert cfg.algorithm.rollout_correction.bypass_mode is False, name
        swe = name.startswith("swe")
        assert rollout.agent.default_agent_loop == ("uniagent_swe" if swe else "uniagent")
    # the negative control: strict composition does reject a key verl lacks
    with pytest.raises(Exception, match="not_a_verl_key"):
        compose_for(build_command("starter_grpo", ["actor_rollout_ref.rollout.not_a_verl_key=1"]))


def test_cpu_fully_async_recipe_composes_for_a_machine_without_gpus() -> None:
    """multiturn_gspo_fully_async_cpu: verl's fully-async entry point with GSPO, partial rollout and a
    staleness bound, the uniagent_local rollout, weights through the uniagent_ray checkpoint engine
    (which the named module registers), and a model directory that also holds the tokenizer
    (fully_async_main reads it from model.path)."""
    import importlib

    from verl.checkpoint_engine import CheckpointEngineRegistry

    command = build_command("multiturn_gspo_fully_async_cpu", [])
    assert command[2] == "verl.experimental.fully_async_policy.fully_async_main"
    cfg = compose_for(command)
    actor, rollout, async_ = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.async_training
    assert (actor.policy_loss.loss_mode, actor.loss_agg_mode) == ("gspo", "seq-mean-token-mean")
    assert async_.partial_rollout is True and async_.staleness_threshold > 0
    assert cfg.actor_rollout_ref.hybrid_engine is False and cfg.data.train_batch_size == 0
    assert rollout.name == "uniagent_local" and cfg.trainer.device == "cpu"
    engine = rollout.checkpoint_engine
    importlib.import_module(engine.custom_backend_module)
    assert CheckpointEngineRegistry.get(engine.backend).__name__ == "RayObjectStoreCheckpointEngine"
    model = Path(cfg.actor_rollout_ref.model.path)
    assert (model / "config.json").is_file() and (model / "tokenizer_config.json").is_file()
    # one logical GPU for the trainer pool and one for the standalone rollout replica
    assert cfg.ray_kwargs.ray_init.num_gpus == cfg.trainer.n_gpus_per_node + cfg.rollout.n_gpus_per_node


MAIN_PPO_RECIPES = [
    "multiturn_grpo",
    "multiturn_grpo_cpu",
    "starter_grpo",
    "starter_gspo",
    "swe_grpo",
    "swe_gspo",
]


def test_main_ppo_recipes_run_verls_legacy_trainer(monkeypatch) -> None:
    """verl's own `main_ppo.main` (the hydra task function, given the composed config) picks the
    legacy TaskRunner for every main_ppo recipe but the V1 one: the trainer where UniAgentLoop's raise
    fails the step (see launch.py). Only `run_ppo`, which would start Ray and the GPU workers, is
    replaced, to record which runner it gets; use_v1=True (and multiturn_grpo_v1_cpu) reach V1's."""
    import verl.trainer.main_ppo as main_ppo
    from verl.trainer.main_ppo_v0 import TaskRunner

    runners: list[type] = []
    monkeypatch.setattr(
        main_ppo, "run_ppo", lambda config, task_runner_class: runners.append(task_runner_class)
    )
    assert {n for n in available_recipes() if load_recipe(n)["entrypoint"] == "verl.trainer.main_ppo"} == {
        *MAIN_PPO_RECIPES,
        "multiturn_grpo_v1_cpu",
    }
    for name in MAIN_PPO_RECIPES:
        cfg = compose_for(build_command(name, []))
        assert cfg.trainer.use_v1 is False
        main_ppo.main(cfg)
        assert runners.pop() is TaskRunner, name
    v1 = build_command("starter_grpo", ["trainer.use_v1=True", "+uniagent.max_infra_failure_share=1.0"])
    main_ppo.main(compose_for(v1))
    assert runners.pop() is main_ppo.TaskRunnerV1
    main_ppo.main(compose_for(build_command("multiturn_grpo_v1_cpu", [])))
    assert runners.pop() is main_ppo.TaskRunnerV1


def test_verl_command_refuses_v1_without_uniagents_replay_buffer_while_the_check_is_on() -> None:
    """Turning verl's V1 trainer on (or deleting the key, which means V1) with the check on and without
    uniagent's replay buffer (`sampler.py`, which does the check there) is one ConfigError naming the
    settings, why (verl's file:line) and the overrides to add, from `uniagent verl command` and
    `uniagent train --engine verl`. With the replay buffer it is allowed, in V1's sync mode only and
    without DAPO's group filter; turning the check off (share 1.0) allows anything; the fully-async
    entry point is not affected."""
    from uniagent.cli import app
    from uniagent.integrations.verl.settings import V1_SAMPLER_OVERRIDES

    for bad in (["trainer.use_v1=True"], ["trainer.use_v1=true"], ["~trainer.use_v1"]):
        for args in (
            ["verl", "command", "swe_gspo", *bad],
            ["train", "--engine", "verl", "--config", "starter_grpo", "--print", "--set", bad[0]],
        ):
            result = CliRunner().invoke(app, args)
            assert isinstance(result.exception, ConfigError), (args, result.output)
            message = str(result.exception)
            assert "trainer.use_v1" in message and "uniagent.max_infra_failure_share=0.5" in message
            assert "agent_loop_tq.py:" in message and V1_SAMPLER_OVERRIDES[0] in message
            assert "\n" not in message and result.output == ""
    with pytest.raises(ConfigError, match=r"max_infra_failure_share=0\.2"):
        build_command("starter_grpo", ["trainer.use_v1=True", "+uniagent.max_infra_failure_share=0.2"])
    checked = build_command("starter_grpo", ["trainer.use_v1=True", *V1_SAMPLER_OVERRIDES])
    assert "trainer.use_v1=True" in checked and V1_SAMPLER_OVERRIDES[-1] in checked
    assert "trainer.use_v1=True" in build_command("multiturn_grpo_v1_cpu", [])
    with pytest.raises(ConfigError, match="sync mode only"):
        build_command("multiturn_grpo_v1_cpu", ["trainer.v1.trainer_mode=colocate_async"])
    with pytest.raises(ConfigError, match="no group filter"):
        build_command("multiturn_grpo_v1_cpu", ["algorithm.filter_groups.enable=True"])
    off = ["trainer.use_v1=True", "+uniagent.max_infra_failure_share=1.0"]
    assert "trainer.use_v1=True" in build_command("starter_grpo", off)
    build_command("multiturn_grpo_v1_cpu", ["algorithm.filter_groups.enable=True", off[1]])
    assert "trainer.use_v1=False" in build_command("starter_grpo", [])
    build_command("starter_gspo_fully_async", [])


def test_build_command_overrides_and_vars() -> None:
    command = build_command(
        "starter_gspo", ["actor_rollout_ref.rollout.n=4", "model@=Qwen/Qwen3-8B", "+trainer.extra_flag=1"]
    )
    assert command[1:3] == ["-m", "verl.trainer.main_ppo"]
    overrides = command[3:]
    assert overrides.count("actor_rollout_ref.rollout.n=4") == 1
    assert not any(o.startswith("actor_rollout_ref.rollout.n=8") for o in overrides)
    assert "actor_rollout_ref.model.path=Qwen/Qwen3-8B" in overrides
    assert "data.train_files=data/verl/starter/train.parquet" in overrides
    assert not any("{" in o for o in overrides if not o.startswith("trainer.logger"))
    assert load_recipe("starter_gspo")["vars"]["tasks"] == "builtin:starter"
    with pytest.raises(ConfigError, match="no verl recipe"):
        build_command("no_such_recipe", [])


def test_launch_runs_verls_entrypoint(capfd) -> None:
    """The real fully-async entry point accepts the recipe (hydra prints the job config and exits)."""
    code = launch("starter_gspo_fully_async", ["--cfg", "job", "--package", "async_training"])
    out = capfd.readouterr().out
    assert code == 0, out
    assert "partial_rollout: true" in out


def test_v1_replay_buffer_is_what_verl_loads_for_the_recipe() -> None:
    """verl builds the V1 recipe's replay buffer from its config as `_build_replay_buffer` does (its
    loader, its keyword arguments): the sync buffer with the group size; the async modes and a missing
    `rollout_n` are one-line errors; the override of verl's `_materialize_batch` keeps its signature."""
    import inspect

    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.utils.import_utils import load_extern_type

    from uniagent.errors import ConfigError
    from uniagent.integrations.verl.launch import build_command
    from uniagent.integrations.verl.sampler import InfraCheckedReplayBuffer

    cfg = compose_for(build_command("multiturn_grpo_v1_cpu", []))
    OmegaConf.resolve(cfg)  # as TaskRunnerV1.run does before building the trainer
    sampler = cfg.trainer.v1.sampler
    cls = load_extern_type(sampler.custom_sampler.path, sampler.custom_sampler.name)
    assert cls.__name__ == InfraCheckedReplayBuffer.__name__ and issubclass(cls, ReplayBuffer)
    kwargs = dict(
        trainer_mode=cfg.trainer.v1.trainer_mode,
        trainer_config=cfg.trainer.v1.get(cfg.trainer.v1.trainer_mode, {}),
        max_off_policy_threshold=sampler.max_off_policy_threshold,
        max_off_policy_strategy=sampler.max_off_policy_strategy,
        sampler_kwargs=sampler.sampler_kwargs,
        refill_fn=lambda n: None,
    )
    assert cls(**kwargs).rollout_n == cfg.actor_rollout_ref.rollout.n == 2
    with pytest.raises(ConfigError, match="trainer_mode=colocate_async"):
        cls(**{**kwargs, "trainer_mode": "colocate_async"})
    with pytest.raises(ConfigError, match=r"sampler_kwargs\.rollout_n"):
        cls(**{**kwargs, "sampler_kwargs": {}})
    ours, verls = (inspect.signature(c._materialize_batch) for c in (cls, ReplayBuffer))
    assert list(ours.parameters) == list(verls.parameters)


def test_a_recipe_extends_another_by_base(tmp_path: Path) -> None:
    """`base:`: the base's overrides first, the recipe's own replacing them key by key; env and vars
    merged; the entry point is the base's; a different entry point or a cycle is a ConfigError."""
    v1, base = load_recipe("multiturn_grpo_v1_cpu"), load_recipe("multiturn_grpo_cpu")
    assert v1["overrides"][: len(base["overrides"])] == base["overrides"]
    assert v1["env"] == base["env"] and v1["vars"] == base["vars"] and "local_config" not in v1
    assert v1["entrypoint"] == base["entrypoint"] and v1["base"] == base["path"]
    resolved = build_command("multiturn_grpo_v1_cpu", [])
    assert "trainer.use_v1=True" in resolved and "trainer.use_v1=False" not in resolved
    assert len([o for o in resolved if o.startswith("trainer.total_training_steps=")]) == 1
    other = tmp_path / "other.yaml"
    other.write_text(
        "base: multiturn_grpo_cpu\nentrypoint: verl.experimental.fully_async_policy.fully_async_main\n"
        "overrides: []\n"
    )
    with pytest.raises(ConfigError, match="differs from its base"):
        load_recipe(other)
    loop_a, loop_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    loop_a.write_text(f"base: {loop_b}\noverrides: []\n")
    loop_b.write_text(f"base: {loop_a}\noverrides: []\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_recipe(loop_a)


def test_a_uniagent_error_in_verls_output_is_the_last_line(capfd) -> None:
    """`run_verl` passes verl's stderr through and, after a failed run, repeats the last uniagent error
    of the last traceback (Ray's prefix and colours stripped) as `error: ...`, the last line; a later
    traceback without one (a crash of verl's own) clears it, and a clean exit adds nothing."""
    died = "rollout server uniagent_local_server_0_0 (pid 7) died during step 2's rollout: gone"
    script = """
import sys
stale, final, tail = sys.argv[1:4]
print("step:1 - actor/grad_norm:0.5")
sys.stderr.write("Traceback (most recent call last):\\n  File 'loop.py'\\n" + stale + "\\n")
sys.stderr.write("Traceback (most recent call last):\\n  File 'main_ppo.py'\\n")
sys.stderr.write("ray.exceptions.RayTaskError(TrainingError): ray::TaskRunner.run()\\n" + final + "\\n")
sys.stderr.write(tail + "\\nTraining Progress:  50%|#####     | 1/2\\r")
sys.exit(int(sys.argv[4]))
"""
    stale = "uniagent.errors.EngineError: an old episode's failure"
    final = f"\x1b[36m(TaskRunner pid=12)\x1b[0m uniagent.errors.TrainingError: {died}"
    tail = "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
    base = [sys.executable, "-c", script, stale]

    assert run_verl([*base, final, tail, "1"], dict(os.environ)) == 1
    out, err = capfd.readouterr()
    assert out.splitlines() == ["step:1 - actor/grad_norm:0.5"]
    assert err.splitlines()[-1] == f"error: {died}" and tail in err and "1/2\r" in err
    assert run_verl([*base, "RuntimeError: verl's own", tail, "1"], dict(os.environ)) == 1
    assert "error:" not in capfd.readouterr().err
    assert run_verl([*base, final, tail, "0"], dict(os.environ)) == 0
    assert "error:" not in capfd.readouterr().err
