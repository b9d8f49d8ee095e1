"""Model specs -> one ChatModel per episode, sharing whatever is expensive (weights, clients).

`local` / `local:PATH`: one LocalEngine for the whole run (iteration-level batching across
episodes), a TokenChatModel per episode. `openai:URL`: OpenAIChatModel (text level, not
trainable; tools described in the prompt and parsed from the text with `model.parser`, or the
endpoint's own `tools` / `tool_calls` with `model.tool_format: native`). `replay:FILE`: recorded
generations, token level (tests, debugging).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import TYPE_CHECKING, Any

from uniagent.errors import ConfigError
from uniagent.models.base import ChatModel, SamplingParams
from uniagent.runner.config import ModelConfig

if TYPE_CHECKING:
    from uniagent.models.openai_chat import OpenAIChatModel


def episode_seed(seed: int, instance_id: str, sample: int) -> int:
    digest = hashlib.sha256(f"{seed}:{instance_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def tokenizer_spec(spec: str, tokenizer: str | None = None) -> str | None:
    """The tokenizer a model spec uses, as `resolve_model` takes it (None: packaged SmolLM2)."""
    kind, _, arg = spec.partition(":")
    return (arg or None) if kind == "local" else tokenizer


class ModelFactory:
    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        kind, _, arg = config.spec.partition(":")
        if kind not in ("local", "openai", "replay"):
            raise ConfigError(f"model.spec {config.spec!r}: use local, local:PATH, openai:URL or replay:FILE")
        if kind in ("openai", "replay") and not arg:
            raise ConfigError(f"model.spec {config.spec!r} needs a value after the colon")
        self.kind, self.arg = kind, arg
        self.engine: Any = None
        self.codec: Any = None

    @property
    def trainable(self) -> bool:
        return self.kind != "openai"

    async def start(self) -> None:
        from uniagent.models.loading import load_tokenizer, resolve_model
        from uniagent.tokens import ChatCodec

        if self.kind == "openai":
            from uniagent.models.openai_chat import OpenAIChatModel  # noqa: F401 - fail early if missing

            return
        tok_spec = tokenizer_spec(self.config.spec, self.config.tokenizer)
        self.codec = ChatCodec(load_tokenizer(resolve_model(tok_spec)))
        if self.kind == "local":
            from uniagent.models.local import LocalEngine

            self.engine = await LocalEngine.create(
                self.arg or None, max_batch_size=self.config.max_batch_size, device=self.config.device
            )
        else:
            from uniagent.models.replay import ReplayEngine

            if not os.path.exists(self.arg):
                raise ConfigError(f"model.spec: replay file {self.arg} does not exist")
            # Records are keyed by request id `INSTANCE#SAMPLE` and turn; prompts are checked when
            # recorded, and a differing prompt is replayed anyway with a warning.
            self.engine = ReplayEngine.from_jsonl(
                self.arg, match="request", strict=False, delay_s=self.config.replay_delay_s
            )

    async def check(self) -> str:
        """The run's preflight of the model (after `start`): an endpoint answers a request; a local
        or replay engine has loaded in `start` already. Raises `EngineError` naming the endpoint."""
        if self.kind != "openai":
            return f"{self.kind} engine loaded"
        model = self._openai()
        try:
            return await model.check()
        finally:
            await model.aclose()

    def _openai(self) -> OpenAIChatModel:
        from uniagent.models.openai_chat import OpenAIChatModel
        from uniagent.parsers import get_parser

        cfg = self.config
        return OpenAIChatModel(
            cfg.name or "default",
            base_url=self.arg,
            api_key=os.environ.get(cfg.api_key_env) or "none",
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            timeout=cfg.timeout_s,
            max_retries=cfg.max_retries,
            parser=get_parser(cfg.parser) if cfg.tool_format == "text" else None,
        )

    def new_model(self, instance_id: str, sample: int, seed: int) -> ChatModel:
        if self.kind == "openai":
            return self._openai()
        from uniagent.models.token_chat import TokenChatModel
        from uniagent.parsers import get_parser

        cfg = self.config
        parser = get_parser(cfg.parser)
        sampling = SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            seed=episode_seed(seed, instance_id, sample),
        )
        rid = f"{instance_id}#{sample}"
        if self.kind == "local":
            rid += f"#{uuid.uuid4().hex[:8]}"
        return TokenChatModel(self.engine, self.codec, parser, sampling, request_id=rid)

    async def close(self) -> None:
        if self.engine is not None and hasattr(self.engine, "aclose"):
            await self.engine.aclose()
