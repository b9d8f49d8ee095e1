"""`RemoteConfig`: the `model.remote:` settings of the token-server engines (vllm, sglang, llamacpp).

The per-request timeout and the retry count are `model.timeout_s` and `model.max_retries` (one
setting for every endpoint kind); the model name sent to the server is `model.name`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RemoteConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    health_interval_s: float = Field(
        5.0, gt=0, description="a replica marked unhealthy is skipped this long before it is probed again"
    )
    health_timeout_s: float = Field(5.0, gt=0, description="seconds a health probe may take")
    connect_timeout_s: float = Field(
        5.0, gt=0, description="seconds to open a connection (a refused or timed-out connect is retried)"
    )
    backoff_s: float = Field(
        0.2, ge=0, description="first retry delay; doubles per retry (with jitter), capped at 5 s"
    )
    max_connections: int = Field(256, ge=1, description="connections shared by all requests to all replicas")
    send_seed: bool = Field(
        True,
        description="send each episode's sampling seed (vLLM `seed`, SGLang `sampling_seed` from 0.5.3 on, "
        "llama-server `seed`); false for a server that rejects the field",
    )
    api_key_env: str | None = Field(
        None,
        description="environment variable with the server's bearer token (vLLM/SGLang/llama-server "
        "--api-key); unset: no Authorization header (model.api_key_env is never sent to a token server)",
    )
