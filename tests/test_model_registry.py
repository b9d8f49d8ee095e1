"""The engine registry: one `KIND` per engine module, one line per kind in `ENGINES`, and every
model construction site (runner, gateway, demo, doctor, trainer, tokenizer lookups) goes through it.

No weights load here. The "fake" engine kind registered in the tests below is a test-only module
whose engine is the real ReplayEngine (scripted turns): it stands in for a new engine someone adds,
to show that the runner runs it with no change of its own.
"""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from conftest import needs_bwrap
from run_helpers import write_replay
from uniagent.errors import ConfigError
from uniagent.models import registry
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.config import ModelConfig
from uniagent.models.factory import ModelFactory, episode_seed, local_weights
from uniagent.models.registry import ENGINES, EngineKind, engine_kind, tokenizer_spec
from uniagent.models.replay import ReplayEngine
from uniagent.models.token_chat import TokenChatModel
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

CLI = [sys.executable, "-m", "uniagent.cli"]


def test_every_registered_kind_parses_from_its_own_module() -> None:
    for name, entry in ENGINES.items():
        kind, arg = engine_kind(f"{name}:ARG")
        assert isinstance(kind, EngineKind) and kind.name == name and arg == "ARG"
        assert kind.usage.startswith(name), kind.usage
        assert sys.modules[entry.module].KIND is kind
        assert kind.doctor is not None, f"{name}: every engine brings its doctor check"
    local, arg = engine_kind("local")
    assert arg == "" and local.token_level and not local.needs_arg
    assert not engine_kind("openai:http://h/v1")[0].token_level
    assert engine_kind("vllm:http://a:8000,http://b:8000")[1] == "http://a:8000,http://b:8000"


def test_the_registry_holds_one_line_per_kind() -> None:
    source = Path(registry.__file__).read_text()
    [call] = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ENGINES"
    ]
    assert isinstance(call, ast.Call)
    table = call.args[1]
    assert isinstance(table, ast.Dict)
    lines = [key.lineno for key in table.keys if key is not None]
    assert len(lines) == len(set(lines)) == len(ENGINES)
    assert len({e.module for e in ENGINES.values()}) == len(ENGINES), "one module per kind"


def test_bad_specs_are_config_errors_that_name_the_usages() -> None:
    with pytest.raises(ConfigError) as info:
        engine_kind("nosuch:x")
    message = str(info.value)
    assert "unknown engine 'nosuch'" in message
    for usage in ("local | local:PATH", "replay:FILE", "openai:URL"):
        assert usage in message, message
    for name in ENGINES:
        assert f"{name}:" in message or name == "local", message
    with pytest.raises(ConfigError, match=r"needs a value after the colon: replay:FILE"):
        engine_kind("replay")
    with pytest.raises(ConfigError, match=r"needs a value after the colon: openai:URL"):
        ModelFactory(ModelConfig(spec="openai:"))


def test_a_run_config_with_an_unknown_kind_fails_before_the_run(tmp_path: Path) -> None:
    from uniagent.runner import build_config

    with pytest.raises(ConfigError, match=r"unknown engine 'bogus'.*vllm:URL"):
        build_config(None, ["model.spec=bogus:1", f"runner.output={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


def test_a_registered_module_that_is_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENGINES, "ghost", "uniagent.models.ghost_engine")
    with pytest.raises(ConfigError, match=r"'ghost' is registered as uniagent.models.ghost_engine"):
        engine_kind("ghost:x")
    assert "ghost:... (not available here)" in registry.usages()
    # a module whose KIND is missing or names another kind is refused too
    module = types.ModuleType("uniagent_test_nokind")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(ENGINES, "nokind", module.__name__)
    with pytest.raises(ConfigError, match="must define KIND"):
        engine_kind("nokind:x")


def test_tokenizer_spec_and_trainer_weights_follow_the_kind() -> None:
    assert tokenizer_spec(ModelConfig(spec="local")) is None
    assert tokenizer_spec(ModelConfig(spec="local:/m/model.gguf", tokenizer="ignored")) == "/m/model.gguf"
    assert tokenizer_spec(ModelConfig(spec="replay:r.jsonl", tokenizer="/tok")) == "/tok"
    assert tokenizer_spec(ModelConfig(spec="openai:http://h/v1")) is None
    assert local_weights("local") is None and local_weights("local:/m") == "/m"
    assert local_weights("/models/x.gguf") == "/models/x.gguf"
    with pytest.raises(ConfigError, match="trains the weights it loads"):
        local_weights("openai:http://h/v1")


def test_model_config_lives_in_models_and_the_runner_reexports_it() -> None:
    from uniagent.runner.config import ModelConfig as RunnerModelConfig

    assert RunnerModelConfig is ModelConfig
    assert "vllm:URL" in ModelConfig.model_fields["spec"].description
    with pytest.raises(ValueError, match="tool_format native needs"):
        ModelConfig(spec="replay:x", tool_format="native")
    assert ModelConfig(spec="openai:http://h/v1", tool_format="native").tool_format == "native"


# -- a new engine kind, registered by one line, used by the runner unchanged ---------------------


class CountingEngine:
    """The real ReplayEngine behind a new kind; records what the factory did with it."""

    def __init__(self, path: str) -> None:
        self.inner = ReplayEngine.from_jsonl(path, match="request", strict=False)
        self.request_ids: list[str] = []
        self.checked = self.closed = False

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> Generation:
        self.request_ids.append(request_id)
        return await self.inner.generate(prompt_ids, sampling, request_id.rsplit("#", 1)[0])

    async def check(self) -> str:
        self.checked = True
        return "fake engine answers"

    async def aclose(self) -> None:
        self.closed = True


BUILT: list[CountingEngine] = []


async def _build_fake(arg: str, config: ModelConfig) -> CountingEngine:
    BUILT.append(CountingEngine(arg))
    return BUILT[-1]


@pytest.fixture
def fake_kind(monkeypatch: pytest.MonkeyPatch) -> EngineKind:
    module = types.ModuleType("uniagent_test_fake_engine")
    module.KIND = EngineKind(name="fake", usage="fake:FILE", token_level=True, build=_build_fake)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(ENGINES, "fake", module.__name__)
    BUILT.clear()
    return module.KIND  # type: ignore[attr-defined,no-any-return]


async def test_a_new_kind_is_built_and_served_by_the_factory(
    fake_kind: EngineKind, tmp_path: Path, codec: ChatCodec
) -> None:
    [task] = load_tasks("builtin:starter", limit=1)
    replay = write_replay(tmp_path / "r.jsonl", codec, [task])
    factory = ModelFactory(ModelConfig(spec=f"fake:{replay}"))
    assert factory.kind is fake_kind and factory.trainable and factory.tokenizer_spec is None
    await factory.start()
    assert await factory.check() == "fake engine answers" and BUILT[0].checked
    model = factory.new_model(task.instance_id, 0, seed=0)
    assert isinstance(model, TokenChatModel) and model.engine is BUILT[0]
    turn = await model.query(task.messages())
    assert turn.completion_tokens > 0 and "tool_call" in turn.text, turn.text
    [rid] = BUILT[0].request_ids
    assert rid.startswith(f"{task.instance_id}#0#"), "each attempt gets a fresh request id"
    await factory.close()
    assert BUILT[0].closed


async def test_a_factory_over_an_engine_built_elsewhere(tmp_path: Path, codec: ChatCodec) -> None:
    """The local trainer and the verl loop get their models from the factory too, over the engine
    they own: the caller's request id and sampling on top of the config's; `start` builds nothing
    and `close` leaves the engine to its owner."""
    [task] = load_tasks("builtin:starter", limit=1)
    engine = CountingEngine(str(write_replay(tmp_path / "r.jsonl", codec, [task])))
    config = ModelConfig(temperature=0.3, max_tokens=64, template_tools=False)
    factory = ModelFactory.over_engine(engine, codec, config)
    assert factory.trainable
    await factory.start()
    rid = f"{task.instance_id}#0#mine"
    model = factory.new_model(task.instance_id, 3, seed=7, request_id=rid, sampling={"max_tokens": 16})
    assert isinstance(model, TokenChatModel) and model.engine is engine and not model.native_tools
    assert model.sampling.temperature == 0.3 and model.sampling.max_tokens == 16
    assert model.sampling.seed == episode_seed(7, task.instance_id, 3)
    turn = await model.query(task.messages())
    assert turn.completion_tokens > 0 and engine.request_ids == [rid]
    await factory.close()
    assert not engine.closed


@needs_bwrap
async def test_the_runner_runs_a_new_kind_with_no_change(
    fake_kind: EngineKind, tmp_path: Path, codec: ChatCodec
) -> None:
    from uniagent.runner import build_config
    from uniagent.runner.run import run

    [task] = load_tasks("builtin:starter", limit=1)
    replay = write_replay(tmp_path / "r.jsonl", codec, [task])
    cfg = build_config(
        None,
        [
            f"model.spec=fake:{replay}",
            "tasks.limit=1",
            f"runner.output={tmp_path / 'run'}",
            "agent.max_turns=4",
        ],
    )
    summary: dict[str, Any] = await run(cfg)
    assert summary["episodes"] == 1 and summary["resolved"] == 1, summary
    assert summary["trainable_fraction"] == 1.0
    [engine] = BUILT
    assert engine.checked and engine.closed, "preflight used the kind's check; the run closed it"


async def test_the_gateway_takes_any_token_level_kind(fake_kind: EngineKind, tmp_path: Path, codec) -> None:
    from uniagent.gateway.app import Gateway
    from uniagent.gateway.cli import gateway_factory

    [task] = load_tasks("builtin:starter", limit=1)
    factory = gateway_factory(f"fake:{write_replay(tmp_path / 'r.jsonl', codec, [task])}")
    await factory.start()
    try:
        Gateway(factory.engine, factory.codec)
    finally:
        await factory.close()
    with pytest.raises(ConfigError, match="is text level: the gateway records token ids"):
        gateway_factory("openai:http://127.0.0.1:9/v1")


def test_gateway_cli_refuses_a_text_level_model_and_an_unknown_one() -> None:
    proc = subprocess.run(
        [*CLI, "gateway", "--model", "openai:http://127.0.0.1:9/v1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "is text level" in proc.stderr, proc.stderr
    proc = subprocess.run(
        [*CLI, "gateway", "--model", "nosuch:x"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "replay:FILE" in proc.stderr, proc.stderr


def test_demo_takes_a_spec_or_a_bare_path() -> None:
    from uniagent.demo import demo_model_config, run_demo

    assert demo_model_config(None).spec == "local"
    assert demo_model_config("/m/model.gguf").spec == "local:/m/model.gguf"
    assert demo_model_config("vllm:http://h:8000").spec == "vllm:http://h:8000"
    with pytest.raises(ConfigError, match="text level"):
        asyncio.run(run_demo("openai:http://127.0.0.1:9/v1"))
