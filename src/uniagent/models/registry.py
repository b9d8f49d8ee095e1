"""The engine registry: every model spec (`local`, `replay:FILE`, `openai:URL`, `vllm:URL,...`) is
one `EngineKind`, defined as `KIND` in its own module and registered here by one line.

Everything that builds a model from a spec (the runner, Ray actors, the gateway, demo, doctor,
verify, the dashboard's and the redactor's tokenizer lookups) goes through `engine_kind`, so adding
an engine is one module plus one line in `ENGINES` (a `uniagent.registry.Registry`, the shape of
every extension table; a line names the module, whose `KIND` is the entry), and never touches the
runner. An engine's doctor check is its `KIND.doctor`, run per spec by `uniagent doctor --model`.

What a module's `KIND.build(arg, config)` returns:

- token level (`token_level=True`): a `TokenEngine`. It may also have `async check() -> str` (the
  run's preflight: the endpoint answers; raise `EngineError` naming it) and `async aclose()`.
- text level (`token_level=False`, episodes not trainable): a `TextModels`, whose `new_model()`
  gives one `ChatModel` per episode, with the same optional `check` and `aclose`.

Modules are imported only when their kind is used, so a spec costs only its own engine's imports.

The `config` every function gets is a `uniagent.models.config.ModelConfig`. This module does not
import it (that module checks specs against this table): the registry reads only `ModelSettings`, and
the kinds' own functions are typed `ModelConfig` in their modules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from uniagent.errors import ConfigError
from uniagent.registry import Entry, Registry

if TYPE_CHECKING:
    from uniagent.models.base import ChatModel

# A doctor row: (name, ok: True works / False broken / None not set up here, detail).
Row = tuple[str, bool | None, str]

# Engine kind (the spec's prefix) -> the module that defines `KIND: EngineKind`. One line per engine.
ENGINES = Registry(
    "engine",
    {
        "local": Entry("uniagent.models.local", "local or local:PATH, weights loaded here"),
        "replay": Entry("uniagent.models.replay", "replay:FILE, recorded turns"),
        "openai": Entry("uniagent.models.openai_chat", "openai:URL, text level"),
        "vllm": Entry("uniagent.models.remote.vllm", "vllm:URL[,URL...]"),
        "sglang": Entry("uniagent.models.remote.sglang", "sglang:URL[,URL...]"),
        "llamacpp": Entry("uniagent.models.remote.llamacpp", "llamacpp:URL[,URL...]"),
    },
    default_attr="KIND",
)


class ModelSettings(Protocol):
    """What the registry itself reads of a `ModelConfig`."""

    spec: str
    tokenizer: str | None


def config_tokenizer(arg: str, config: ModelSettings) -> str | None:
    """The default tokenizer of a kind that loads no weights here: `model.tokenizer` (None: SmolLM2)."""
    return config.tokenizer


class TextModels(Protocol):
    """What a text-level kind builds: one `ChatModel` per episode (plus optional `check`/`aclose`)."""

    def new_model(self) -> ChatModel: ...


@dataclass(frozen=True)
class EngineKind:
    """One engine kind.

    `usage` is how a spec of this kind is written (error messages and `--help`); `build(arg, config)`
    builds the engine (token level) or the `TextModels` (text level) from the part after the colon;
    `tokenizer(arg, config)` is the tokenizer spec `resolve_model` takes (None: packaged SmolLM2);
    `doctor(arg, config, quick)` is `uniagent doctor --model SPEC`'s check (quick: no weight loads);
    `fresh_request_ids`: each episode attempt gets a request id of its own (`INSTANCE#SAMPLE#xxxx`),
    so server-side state of an abandoned attempt (a cached prefix, a sticky session) is never taken
    for this one; replay turns it off to find its records by `INSTANCE#SAMPLE`.
    """

    name: str
    usage: str
    token_level: bool
    build: Callable[[str, Any], Awaitable[Any]]  # (arg, ModelConfig)
    needs_arg: bool = True
    tokenizer: Callable[[str, Any], str | None] = config_tokenizer  # (arg, ModelConfig)
    doctor: Callable[[str, Any, bool], Awaitable[list[Row]]] | None = None  # (arg, ModelConfig, quick)
    fresh_request_ids: bool = True


def split_spec(spec: str) -> tuple[str, str]:
    """`KIND[:ARG]` -> (kind, arg); the kind must be registered (no import yet)."""
    kind, _, arg = spec.strip().partition(":")
    if kind not in ENGINES:
        raise ConfigError(f"model spec {spec!r}: {ENGINES.unknown(kind, ' | '.join(usages()))}")
    return kind, arg.strip()


def load_kind(kind: str) -> EngineKind:
    """Import the module registered for `kind` and return its `KIND`."""
    if kind not in ENGINES:
        raise ENGINES.unknown(kind, " | ".join(usages()))
    try:
        found = ENGINES.load(kind)
    except AttributeError:
        found = None
    if not isinstance(found, EngineKind) or found.name != kind:
        raise ConfigError(f"{ENGINES[kind].module} must define KIND = EngineKind(name={kind!r}, ...)")
    return found


def engine_kind(spec: str) -> tuple[EngineKind, str]:
    """Parse a model spec into its engine kind and argument; a bad spec raises a `ConfigError`
    that lists every registered usage."""
    name, arg = split_spec(spec)
    kind = load_kind(name)
    if kind.needs_arg and not arg:
        raise ConfigError(f"model spec {spec!r} needs a value after the colon: {kind.usage}")
    return kind, arg


def usages() -> list[str]:
    """How each registered kind is written (imports every engine module; for error messages)."""
    out = []
    for kind in ENGINES:
        try:
            out.append(load_kind(kind).usage)
        except ConfigError:
            out.append(f"{kind}:... (not available here)")
    return out


def kinds_help() -> str:
    """A one-line list of the registered kinds for `--help`, without importing any engine."""
    return f"KIND[:ARG], KIND one of {', '.join(ENGINES)} (e.g. local, local:PATH, vllm:URL[,URL...])"


def tokenizer_spec(config: ModelSettings) -> str | None:
    """The tokenizer a model config uses, as `resolve_model` takes it (None: the packaged SmolLM2)."""
    kind, arg = engine_kind(config.spec)
    return kind.tokenizer(arg, config)


async def aclose(obj: Any) -> None:
    """Close an engine or a `TextModels` when it has `aclose`."""
    close = getattr(obj, "aclose", None)
    if close is not None:
        await close()
