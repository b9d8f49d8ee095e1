"""`ModelConfig`: the one `model:` section, shared by `uniagent run` (and the gateway, doctor and
verify), `uniagent train` and the verl agent loop (`uniagent.model`).

It lives in `models/` beside the engine registry that reads it, so an engine module can take its
settings from it without importing the runner. It checks a spec against the registry's table
(imported at the top: the registry reads a config through its own `ModelSettings` protocol and
never imports this module).

Each user keeps its own defaults (`TrainConfig` samples at temperature 1.0) and checks what it
cannot apply (train: the spec must be weights it loads; verl: the spec, the engine and the batch
are verl's own). A field that applies only to some of them says so in its description.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uniagent.models.precision import check as check_dtype
from uniagent.models.registry import engine_kind, split_spec
from uniagent.models.remote.config import RemoteConfig
from uniagent.parsers.registry import known_parser


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: str = Field(
        "local",
        description="KIND[:ARG], one engine of the registry (uniagent.models.registry.ENGINES): "
        "local | local:PATH | replay:FILE | openai:URL (text level, not trainable) | "
        "vllm:URL[,URL...] | sglang:URL[,URL...] | llamacpp:URL[,URL...]",
    )
    name: str | None = Field(None, description="model name sent to an OpenAI-compatible endpoint")
    parser: str = Field("hermes", description="tool-call format the model writes (uniagent.parsers.PARSERS)")
    tool_format: Literal["text", "native"] = Field(
        "text",
        description="openai:URL: text (tools in the prompt, calls parsed from the text with `parser`) "
        "| native (the endpoint's `tools` and `tool_calls`)",
    )
    template_tools: bool | None = Field(
        None,
        description="token-level models: the chat template renders the tool list and the model's tool "
        "calls (true) or the tools go into the prompt as the parser's instructions (false); None: "
        "true when the template can render tool calls. Either way the calls are parsed from the text "
        "with `parser`",
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
    max_tokens: int = Field(
        512,
        ge=1,
        description="tokens per model turn, the one per-turn cap (the context cap, agent.max_context_tokens, "
        "may leave a turn less); verl: unset means rollout.response_length",
    )
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
    device: str = Field("cpu", description="local engine and the local trainer: the torch device")
    dtype: str = Field(
        "auto",
        description="the precision the local engine serves in and the local trainer computes in: auto | "
        "float32 | bfloat16 (| float16: engines only). auto: bfloat16 where a start-up probe measured bf16 "
        "matmuls at least 1.5x faster than fp32 on this machine (AMX, AVX512-BF16, a bf16 GPU), else "
        "float32 (`uniagent doctor` says which). The local trainer keeps fp32 master weights and optimizer "
        "state and runs bfloat16 under autocast; verl's FSDP actor keeps fp32 under auto "
        "(models/precision.py)",
    )
    max_retries: int = Field(3, ge=0, description="endpoint: retries per request")
    timeout_s: float = Field(300.0, gt=0, description="endpoint: per-request timeout")
    remote: RemoteConfig = RemoteConfig()  # vllm/sglang/llamacpp: health checks, connections, retry backoff

    @field_validator("spec")
    @classmethod
    def _registered_kind(cls, spec: str) -> str:
        """A kind the registry does not know fails here, before a run creates anything (the
        kind's module is imported only when the model is built)."""
        split_spec(spec)
        return spec

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, name: str) -> str:
        return check_dtype(name)

    @field_validator("parser")
    @classmethod
    def _parser(cls, name: str) -> str:
        return known_parser(name)

    @model_validator(mode="after")
    def _native_needs_endpoint(self) -> ModelConfig:
        if self.tool_format != "native":
            return self
        kind, _ = engine_kind(self.spec)
        if kind.token_level:
            raise ValueError(
                "tool_format native needs an openai:URL model, or another text-level kind (token-level "
                "models parse tool calls from their text with model.parser)"
            )
        return self
