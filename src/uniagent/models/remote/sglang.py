"""SGLang dialect: the native `POST /generate` with `input_ids`, logprobs of the sampled tokens back.

Spec: `sglang:http://HOST:30000[,http://HOST2:30000...]`. Fields, from SGLang's docs
(`docs/basic_usage/sampling_params.md`, "/generate Endpoint" and "Sampling parameters", which point
at `io_struct.py::GenerateReqInput` and `sampling_params.py::SamplingParams`):

- request `input_ids: list[int]` (one prompt, not re-tokenized), `rid` (the request id `abort`
  names), `return_logprob: true`, `logprob_start_len: -1` (output tokens only), `top_logprobs_num: 0`,
  `stream: false`, and `sampling_params` with `max_new_tokens`, `temperature`, `top_p`, `top_k` (-1
  disables), `min_p`, `repetition_penalty`, `frequency_penalty`, `presence_penalty` (all sent
  explicitly: by default the server takes them from the model's generation_config, "Note on
  defaults", `--sampling-defaults model`), `stop_token_ids`, `no_stop_trim: true` and, when the
  episode has a seed, `sampling_seed` (`SamplingParams.sampling_seed`, SGLang >= 0.5.3; set
  `model.remote.send_seed: false` for an older server).
- response `meta_info.output_token_logprobs`: one `[logprob, token_id, text|null]` per generated
  token (`tokenizer_manager.py`, `add_logprob_to_meta_info` / `detokenize_logprob_tokens`);
  `output_ids` (the same ids; checked when present); `meta_info.finish_reason`: `{"type": "stop",
  "matched": ID}` | `{"type": "length", "length": N}` | `{"type": "abort", ...}`
  (`schedule_batch.py`, `FINISH_MATCHED_TOKEN` / `FINISH_LENGTH` / `FINISH_ABORT.to_json`).

Stop tokens: `stop_token_ids` ends generation on the sampled id, which stays in the output ids and
logprobs (`FINISH_MATCHED_TOKEN(matched=...)` is set after the token is appended; `no_stop_trim`
also keeps it in the text).

Logprobs: "after_temperature". SGLang's sampler (`python/sglang/srt/layers/sampler.py`) divides the
logits by the temperature before it takes the log of the probabilities it samples from, so at a
temperature other than 1 the logprob is not the raw model's; launch the server with
`SGLANG_RETURN_ORIGINAL_LOGPROB=1` to get the raw (pre-temperature) logprob, which a trainer
recomputes. Greedy requests return the raw log-softmax either way.

Abort: `POST /abort_request {"rid": ...}` (`http_server.py`, `abort_request(obj: AbortReq)`), sent
in the background when a request is cancelled or times out; the closed connection is also seen by the
server (the tokenizer manager aborts a request whose client disconnected). Health: `GET /health`.
"""

from __future__ import annotations

from typing import Any

from uniagent.models.base import Generation, SamplingParams
from uniagent.models.remote.base import Dialect, generation
from uniagent.models.remote.kind import remote_kind


class SGLangDialect(Dialect):
    name = "sglang"
    generate_path = "/generate"
    health_path = "/health"
    logprobs = "after_temperature"

    def request(self, prompt_ids: list[int], sampling: SamplingParams, call_id: str) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "stop_token_ids": sampling.stop_token_ids,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        return {
            "input_ids": prompt_ids,
            "sampling_params": params,
            "rid": call_id,
            "return_logprob": True,
            "logprob_start_len": -1,
            "top_logprobs_num": 0,
            "stream": False,
        }

    def response(self, data: Any, sampling: SamplingParams) -> Generation:
        meta = data["meta_info"]
        triples = meta["output_token_logprobs"]
        if not isinstance(triples, list) or not all(isinstance(t, list) and len(t) >= 2 for t in triples):
            raise ValueError("meta_info.output_token_logprobs is not a list of [logprob, token_id, ...]")
        token_ids = [t[1] for t in triples]
        output_ids = data.get("output_ids")
        if output_ids is not None and output_ids != token_ids:
            raise ValueError("output_ids and meta_info.output_token_logprobs name different tokens")
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else finish
        return generation(token_ids, [t[0] for t in triples], kind)

    def abort(self, call_id: str) -> tuple[str, dict[str, Any]]:
        return "/abort_request", {"rid": call_id}


KIND = remote_kind(SGLangDialect)
