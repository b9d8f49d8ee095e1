"""`ModelConfig`: the `model:` section of a run (and of the gateway, doctor and verify).

It lives in `models/` beside the engine registry that reads it, so an engine module can take its
settings from it without importing the runner. `uniagent.runner.config` re-exports it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uniagent.models.remote.config import RemoteConfig


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: str = Field(
        "local",
        description="KIND[:ARG], one engine of the registry (uniagent.models.registry.ENGINES): "
        "local | local:PATH | replay:FILE | openai:URL (text level, not trainable) | "
        "vllm:URL[,URL...] | sglang:URL[,URL...] | llamacpp:URL[,URL...]",
    )
    name: str | None = Field(None, description="model name sent to an OpenAI-compatible endpoint")
    parser: str = Field("hermes", description="tool-call format the model writes")
    tool_format: Literal["text", "native"] = Field(
        "text",
        description="openai:URL: text (tools in the prompt, calls parsed from the text with `parser`) "
        "| native (the endpoint's `tools` and `tool_calls`)",
    )
    history: Literal["exact", "template"] = Field(
        "exact",
        description="token-level models: exact (the model always sees its own tokens, appended turn "
        "after turn; a template that would show earlier turns differently, e.g. without their "
        "reasoning, shows up as drift) | template (then a new segment starts, rendered as the "
        "template does: what a chat endpoint would show the model)",
    )
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(512, ge=1, description="tokens per model turn")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the API key")
    tokenizer: str | None = Field(
        None,
        description="engines that do not load weights here (replay, servers): the tokenizer's model, "
        "a local directory or .gguf file (default: packaged SmolLM2)",
    )
    replay_delay_s: float = Field(0.0, ge=0, description="replay: seconds per generation (simulated latency)")
    max_batch_size: int = Field(16, ge=1, description="local engine: rows decoded together")
    memory_budget_bytes: int | None = Field(
        None,
        ge=0,
        description="local engine: bytes its keys/values, prefill activations and kept prefixes may use "
        "together; work that does not fit waits in the queue (None: half of the memory available at start, "
        "MemAvailable or the cgroup's limit, whichever is less)",
    )
    prefix_cache_bytes: int | None = Field(
        None,
        ge=0,
        description="local engine: the most of the memory budget keys/values kept between an episode's "
        "turns may hold; running work evicts them first (None: a quarter of the budget; 0: off)",
    )
    device: str = "cpu"
    max_retries: int = Field(3, ge=0, description="endpoint: retries per request")
    timeout_s: float = Field(300.0, gt=0, description="endpoint: per-request timeout")
    remote: RemoteConfig = RemoteConfig()  # vllm/sglang/llamacpp: health checks, connections, retry backoff

    @field_validator("spec")
    @classmethod
    def _registered_kind(cls, spec: str) -> str:
        """A kind the registry does not know fails here, before a run creates anything (the
        kind's module is imported only when the model is built)."""
        from uniagent.models.registry import split_spec

        split_spec(spec)
        return spec

    @model_validator(mode="after")
    def _native_needs_endpoint(self) -> ModelConfig:
        if self.tool_format != "native":
            return self
        from uniagent.models.registry import engine_kind

        kind, _ = engine_kind(self.spec)
        if kind.token_level:
            raise ValueError(
                "tool_format native needs an openai:URL model, or another text-level kind (token-level "
                "models parse tool calls from their text with model.parser)"
            )
        return self
