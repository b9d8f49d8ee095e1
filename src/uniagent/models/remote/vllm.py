"""vLLM dialect: `POST /v1/completions` with a token-id prompt, token ids and logprobs back.

Spec: `vllm:http://HOST:8000[,http://HOST2:8000...]` (no `/v1`). Fields, from vLLM's source
(`vllm/entrypoints/openai/completion/protocol.py`, `CompletionRequest` / `CompletionResponseChoice`):

- request `prompt: list[int]` (a token-id prompt is used as is, not re-tokenized); `max_tokens`,
  `temperature`, `top_p`, `top_k` (-1 or 0 disables: `SamplingParams._verify_args`, "quietly accept -1
  as disabled"), `min_p`, `repetition_penalty`, `presence_penalty`, `frequency_penalty` (all sent
  explicitly: the server otherwise fills them from the model's generation_config, which would change
  the distribution the trainer thinks was sampled), `seed`, `stop_token_ids`, `request_id`, and
  `model` (optional there, `model: str | None = None`; sent when `model.name` is set).
- `logprobs: 0`: the logprob of each sampled token only (`_create_completion_logprobs` in
  `completion/serving.py` adds top-0 alternatives; -inf is clamped to -9999.0).
- `return_token_ids: true` (vLLM >= 0.10.2): `choices[0].token_ids` holds the generated ids.
  `return_tokens_as_token_ids: true`: `choices[0].logprobs.tokens` are `"token_id:N"` strings, which is
  how the ids are read from older servers. When both are present they must agree. Unknown request
  fields are ignored by older servers (`OpenAIBaseModel` allows extra fields and logs them).
- response `choices[0].logprobs.token_logprobs` (one per generated token), `finish_reason`
  (`stop` | `length` | `abort`).

Stop tokens: a sampled id in `stop_token_ids` (or the model's eos) finishes the request with that id
kept in the output ids (`vllm/v1/core/sched/utils.py`, `check_stop`: it only sets the status after the
token was appended); `include_stop_str_in_output` concerns text only. So the end-of-turn token that
`TokenChatModel` looks for is the last returned id, as with `LocalEngine`.

Logprobs: "raw". vLLM v1 computes them from the model's logits before temperature, penalties and
top-k/top-p with the default `--logprobs-mode raw_logprobs` (`vllm/config/model.py`,
`ModelConfig.logprobs_mode`; `processed_logprobs` gives post-processing values instead). The V0 engine
(vLLM < 0.10) returned processed logprobs.

Abort: closing the connection. `create_completion` is wrapped in `@with_cancellation`
(`vllm/entrypoints/utils.py`; `completion/api_router.py`), which cancels the handler when the client
disconnects, and the engine aborts the request. Health: `GET /health` answers 200 when the engine runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from uniagent.models.base import Generation, SamplingParams
from uniagent.models.remote.base import Dialect, generation
from uniagent.models.remote.kind import remote_kind

if TYPE_CHECKING:
    from uniagent.models.config import ModelConfig


class VLLMDialect(Dialect):
    name = "vllm"
    generate_path = "/v1/completions"
    health_path = "/health"
    logprobs = "raw"

    def __init__(self, model: str | None = None) -> None:
        self.model = model

    @classmethod
    def from_config(cls, config: ModelConfig) -> VLLMDialect:
        return cls(config.name)

    def request(self, prompt_ids: list[int], sampling: SamplingParams, call_id: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt_ids,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "stop_token_ids": sampling.stop_token_ids,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "n": 1,
            "stream": False,
            "request_id": call_id,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if self.model:
            body["model"] = self.model
        return body

    def response(self, data: Any, sampling: SamplingParams) -> Generation:
        choices = data["choices"]
        if not isinstance(choices, list) or len(choices) != 1:
            raise ValueError(f"expected one choice, got {choices!r:.80}")
        choice = choices[0]
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict):
            raise ValueError("no logprobs in the choice (the server ignored `logprobs: 0`)")
        from_tokens = [_token_id(token) for token in logprobs.get("tokens") or []]
        token_ids = choice.get("token_ids")
        if token_ids is None:
            token_ids = from_tokens
        elif from_tokens and from_tokens != token_ids:
            raise ValueError("choices[0].token_ids and logprobs.tokens name different tokens")
        return generation(token_ids, logprobs.get("token_logprobs"), choice.get("finish_reason"))


def _token_id(token: Any) -> int:
    if not isinstance(token, str) or not token.startswith("token_id:"):
        raise ValueError(
            f"logprobs token {token!r} is not 'token_id:N' (the server ignored return_tokens_as_token_ids)"
        )
    return int(token.removeprefix("token_id:"))


KIND = remote_kind(VLLMDialect)
