"""The config spine's shared sections: one `ModelConfig` and one `AgentConfig` (with `kind`) in
run, train and the verl agent loop, and keys that moved naming their new place (`RENAMED`)."""

from __future__ import annotations

import pytest

from uniagent.config import RENAMED, validate_config
from uniagent.errors import ConfigError
from uniagent.integrations.verl.settings import UniAgentLoopSettings, validate_settings
from uniagent.models.config import ModelConfig
from uniagent.runner.config import RunConfig, build_config
from uniagent.train.config import TrainConfig, build_train_config


@pytest.mark.parametrize(
    ("model", "data", "new"),
    [
        (RunConfig, {"agent_kind": "react"}, "agent.kind"),
        (TrainConfig, {"agent_kind": "react"}, "agent.kind"),
        (RunConfig, {"agent": {"max_tokens_per_turn": 9}}, "model.max_tokens"),
        (TrainConfig, {"agent": {"max_tokens_per_turn": 9}}, "model.max_tokens"),
        (UniAgentLoopSettings, {"max_tokens_per_turn": 9}, "model.max_tokens"),
        (UniAgentLoopSettings, {"parser": "hermes"}, "model.parser"),
        (UniAgentLoopSettings, {"native_tools": True}, "model.template_tools"),
        (UniAgentLoopSettings, {"agent_kind": "react"}, "agent.kind"),
    ],
)
def test_an_old_key_is_one_line_naming_the_new_one(model, data, new) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(model, data)
    message = str(info.value)
    assert "\n" not in message and f"is now {new}" in message, message
    assert new in RENAMED[model.__name__].values()


def test_one_model_config_shared_with_each_users_defaults() -> None:
    run, train, verl = build_config(None, []), build_train_config(None, []), UniAgentLoopSettings()
    assert type(run.model) is type(train.model) is type(verl.model) is ModelConfig
    assert (run.model.temperature, run.model.max_tokens, run.model.max_batch_size) == (0.7, 512, 16)
    assert (train.model.temperature, train.model.max_tokens, train.model.max_batch_size) == (1.0, 64, 32)
    assert train.model.dtype == "auto" and train.agent.kind == run.agent.kind == "react"
    # model.history applies in all three
    assert build_train_config(None, ["model.history=template"]).model.history == "template"
    assert validate_settings({"model": {"history": "template"}}, "x").model.history == "template"


def test_train_takes_only_weights_it_loads() -> None:
    assert build_train_config(None, ["model.spec=/models/m"]).model.spec == "local:/models/m"
    assert build_train_config(None, ["model.spec=local:/models/m"]).model.spec == "local:/models/m"
    with pytest.raises(
        ConfigError, match=r"^config model\.spec: model spec 'vllm:http://h'.*trains the weights"
    ):
        build_train_config(None, ["model.spec=vllm:http://h"])
    with pytest.raises(ConfigError, match=r"^config model\.timeout_s does not apply to training"):
        build_train_config(None, ["model.timeout_s=3"])
    with pytest.raises(ConfigError, match=r"model\.parser.*unknown tool parser 'nope'"):
        build_train_config(None, ["model.parser=nope"])


def test_verls_per_turn_cap_is_model_max_tokens() -> None:
    assert UniAgentLoopSettings().max_tokens(4096) == 4096, "unset: all of rollout.response_length"
    assert validate_settings({"model": {"max_tokens": 40}}, "x").max_tokens(4096) == 40
    with pytest.raises(ConfigError, match=r"verl agent loop 'x': .*model\.spec does not apply in verl"):
        validate_settings({"model": {"spec": "local"}}, "x")


def test_the_sandbox_section_is_parsed_once_and_travels_typed() -> None:
    """Loaded once into the backend's config; a task without an image hands the same object to the
    backend; dumped as written, so a Ray actor re-parsing it sees the same user settings."""
    from uniagent.sandbox import ContainerConfig, LocalConfig
    from uniagent.sandbox.config import as_written
    from uniagent.tasks import load_tasks

    cfg = build_config(None, ["sandbox.network=true", "sandbox.limits.pids=64"])
    assert isinstance(cfg.sandbox, LocalConfig) and cfg.sandbox.network
    task = load_tasks("builtin:starter")[0]
    assert task.sandbox_config(cfg.sandbox) is cfg.sandbox, "not parsed again"
    dumped = cfg.model_dump(mode="json")["sandbox"]
    assert dumped == {"type": "local", "network": True, "limits": {"pids": 64}}
    again = RunConfig.model_validate(cfg.model_dump(mode="json")).sandbox
    assert as_written(again) == dumped and again == cfg.sandbox
    image = build_config(None, ["sandbox.type=container", "sandbox.image=x:1"]).sandbox
    assert isinstance(image, ContainerConfig) and as_written(image) == {"type": "container", "image": "x:1"}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("runner.backend=k8s", r"runner\.backend: .*unknown runner backend 'k8s'; known: local, ray"),
        (
            "tasks.spec=builtin:nope",
            r"tasks\.spec: .*unknown bundled suite 'builtin:nope'; known: builtin:starter",
        ),
    ],
)
def test_runner_backend_and_bundled_suite_are_checked_against_their_tables(override, message) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config(overrides=[override])
    assert build_train_config(overrides=["tasks.spec=toy"]).tasks.spec == "toy"
    assert build_config().runner.backend == "local" and build_config().tasks.spec == "builtin:starter"
