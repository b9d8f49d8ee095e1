"""A model config -> one `ChatModel` per episode, sharing whatever is expensive (weights, clients).

This is the one place chat models are made: `uniagent run` (local and Ray, `runner.worker`), the
demo, the local trainer and the verl agent loop all ask a factory. The engine comes from the
registry (`uniagent.models.registry`): a token-level kind gives one `TokenEngine` for the whole
process (a local engine batches across episodes; a server engine keeps its connections) and a
`TokenChatModel` per episode; a text-level kind (`openai:URL`) gives its own `ChatModel` per
episode (its `TextModels.new_model`), whose episodes are not trainable. `over_engine` wraps an
engine someone else built and owns (the trainer's policy engine, verl's server manager), so those
callers get the same models without a spec. Nothing here names an engine kind.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import TYPE_CHECKING, Any

from uniagent.errors import ConfigError
from uniagent.models.base import ChatModel, SamplingParams, TokenEngine
from uniagent.models.config import ModelConfig
from uniagent.models.registry import ENGINES, EngineKind, aclose, engine_kind

if TYPE_CHECKING:
    from uniagent.tokens import ChatCodec


def episode_seed(seed: int, instance_id: str, sample: int) -> int:
    """A run's seed spread over its episodes: the same pair always samples the same way."""
    digest = hashlib.sha256(f"{seed}:{instance_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def local_weights(spec: str) -> str | None:
    """The model a process that owns the weights (the local trainer) loads, as `resolve_model` takes
    it: the registry's `local` / `local:PATH`, or a bare directory or .gguf path. Any other kind
    serves weights elsewhere, which such a process cannot train."""
    name, _, arg = spec.partition(":")
    if name not in ENGINES:
        return spec  # a bare path
    if name != "local":
        raise ConfigError(
            f"model spec {spec!r}: this process trains the weights it loads, so use local, local:PATH "
            "or a model directory / .gguf path"
        )
    return arg or None


async def _built_elsewhere(arg: str, config: ModelConfig) -> Any:
    raise RuntimeError("a factory over a given engine never builds one")


# The kind of a factory made by `over_engine`: token level, its engine built (and closed) by the caller.
GIVEN = EngineKind("given", "an engine built by the caller", token_level=True, build=_built_elsewhere)


class ModelFactory:
    """Parses the spec at construction (a bad spec is a `ConfigError` before anything starts);
    `start` builds the engine and, for token-level kinds, the `ChatCodec` of its tokenizer.
    Everything a model is made with comes from the one `ModelConfig` (`template_tools`: show
    tools natively, None: when the template renders tool calls)."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.kind, self.arg = engine_kind(config.spec)
        self.engine: Any = None  # a TokenEngine (token level) or the kind's TextModels (text level)
        self.codec: Any = None  # token level only
        self.owns_engine = True

    @classmethod
    def over_engine(
        cls,
        engine: TokenEngine,
        codec: ChatCodec,
        config: ModelConfig | None = None,
    ) -> ModelFactory:
        """A started factory over a token engine its caller built and owns (the local trainer's
        policy engine, verl's server manager): `config` gives the sampling, parser and history
        (its `spec` is not read); `close` leaves the engine to its owner."""
        factory = cls(ModelConfig() if config is None else config)
        factory.kind, factory.arg = GIVEN, ""
        factory.engine, factory.codec = engine, codec
        factory.owns_engine = False
        return factory

    @property
    def trainable(self) -> bool:
        return self.kind.token_level

    @property
    def tokenizer_spec(self) -> str | None:
        """The tokenizer this model uses, as `resolve_model` takes it (None: packaged SmolLM2)."""
        return self.kind.tokenizer(self.arg, self.config)

    async def start(self) -> None:
        """Build the engine (and the codec); a started factory stays as it is."""
        import asyncio

        if self.engine is not None:
            return
        if self.kind.token_level:
            from uniagent.models.loading import load_tokenizer, resolve_model
            from uniagent.tokens import ChatCodec

            tokenizer = await asyncio.to_thread(load_tokenizer, resolve_model(self.tokenizer_spec))
            self.codec = ChatCodec(tokenizer)
        self.engine = await self.kind.build(self.arg, self.config)

    async def check(self) -> str:
        """The run's preflight of the model (started first when it is not yet): an endpoint answers
        a request; an engine without a `check` has loaded in `start` already. Raises `EngineError`
        naming the endpoint."""
        if self.engine is None:
            await self.start()
        check = getattr(self.engine, "check", None)
        if check is None:
            return f"{self.kind.name} engine loaded"
        return str(await check())

    def sampling_params(self, **fields: Any) -> SamplingParams:
        """The config's sampling with `fields` (SamplingParams fields: a seed, overrides) on top."""
        cfg = self.config
        base = {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_tokens}
        return SamplingParams(**{**base, **fields})

    def new_model(
        self,
        instance_id: str,
        sample: int,
        seed: int | None = None,
        *,
        request_id: str | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> ChatModel:
        """The model of one episode (sample `sample` of `instance_id`).

        Token level: sampled with the config's settings, seeded by `episode_seed(seed, ...)` (None:
        unseeded), `sampling` (SamplingParams fields: verl's per-batch temperature and per-turn cap,
        the demo's own seed) on top; `request_id` (default `INSTANCE#SAMPLE`, plus a fresh suffix
        where the kind asks for one) is the engine's sticky id for the episode. A text-level kind
        makes its own model, which says it is not trainable (`ChatModel.trainable`)."""
        if self.engine is None:
            raise RuntimeError("ModelFactory.new_model before start()")
        if not self.kind.token_level:
            model: ChatModel = self.engine.new_model()
            return model
        from uniagent.models.token_chat import TokenChatModel
        from uniagent.parsers import get_parser

        rid = request_id
        if rid is None:
            rid = f"{instance_id}#{sample}"
            if self.kind.fresh_request_ids:
                rid += f"#{uuid.uuid4().hex[:8]}"
        derived = None if seed is None else episode_seed(seed, instance_id, sample)
        return TokenChatModel(
            self.engine,
            self.codec,
            get_parser(self.config.parser),
            self.sampling_params(**{"seed": derived, **(sampling or {})}),
            request_id=rid,
            native_tools=self.config.template_tools,
            follow_template=self.config.history == "template",
        )

    async def close(self) -> None:
        """Close the engine this factory built (one given to `over_engine` stays its owner's)."""
        if self.engine is not None and self.owns_engine:
            await aclose(self.engine)
