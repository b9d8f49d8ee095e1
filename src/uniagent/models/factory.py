"""A model config -> one `ChatModel` per episode, sharing whatever is expensive (weights, clients).

The engine comes from the registry (`uniagent.models.registry`): a token-level kind gives one
`TokenEngine` for the whole process (a local engine batches across episodes; a server engine keeps
its connections) and a `TokenChatModel` per episode; a text-level kind (`openai:URL`) gives its own
`ChatModel` per episode, whose episodes are not trainable. Nothing here names an engine kind.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from uniagent.errors import ConfigError
from uniagent.models.base import ChatModel, SamplingParams
from uniagent.models.config import ModelConfig
from uniagent.models.registry import ENGINES, aclose, engine_kind


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


class ModelFactory:
    """Parses the spec at construction (a bad spec is a `ConfigError` before anything starts);
    `start` builds the engine and, for token-level kinds, the `ChatCodec` of its tokenizer."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.kind, self.arg = engine_kind(config.spec)
        self.engine: Any = None  # a TokenEngine (token level) or the kind's TextModels (text level)
        self.codec: Any = None  # token level only

    @property
    def trainable(self) -> bool:
        return self.kind.token_level

    @property
    def tokenizer_spec(self) -> str | None:
        """The tokenizer this model uses, as `resolve_model` takes it (None: packaged SmolLM2)."""
        return self.kind.tokenizer(self.arg, self.config)

    async def start(self) -> None:
        import asyncio

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

    def new_model(self, instance_id: str, sample: int, seed: int) -> ChatModel:
        if self.engine is None:
            raise RuntimeError("ModelFactory.new_model before start()")
        if not self.kind.token_level:
            model: ChatModel = self.engine.new_model()
            return model
        from uniagent.models.token_chat import TokenChatModel
        from uniagent.parsers import get_parser

        cfg = self.config
        sampling = SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            seed=episode_seed(seed, instance_id, sample),
        )
        rid = f"{instance_id}#{sample}"
        if self.kind.fresh_request_ids:
            rid += f"#{uuid.uuid4().hex[:8]}"
        return TokenChatModel(
            self.engine,
            self.codec,
            get_parser(cfg.parser),
            sampling,
            request_id=rid,
            native_tools=cfg.template_tools,
            follow_template=cfg.history == "template",
        )

    async def close(self) -> None:
        if self.engine is not None:
            await aclose(self.engine)
