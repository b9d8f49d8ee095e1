"""llama.cpp dialect: llama-server's native `POST /completion` with a token-id prompt, token ids and
raw logprobs back.

Spec: `llamacpp:http://HOST:8080[,http://HOST2:8080...]`. Fields, from the llama.cpp that the pinned
`llama-cpp-python` sdist vendors (scripts/build-llama-server.sh; paths under vendor/llama.cpp/, line
numbers of the 0.3.36 copy):

- request (`tools/server/README.md:483`, "POST /completion"; parsed in `tools/server/server-schema.cpp`:
  cache_prompt :31, return_tokens :34, n_predict :44, n_probs :179, post_sampling_probs :190,
  logit_bias :434, samplers :505):
  `prompt: list[int]` (a token sequence is used as is; no BOS is added to an id list), `n_predict`,
  `temperature`, `top_k` (0 disables), `top_p`, `seed` (-1: random), `samplers` (the chain; we send
  temperature -> top_k -> top_p, the order transformers and vLLM use, so none of the server's
  defaults such as min_p 0.05 or top_k 40 applies), `n_probs: 1` with `post_sampling_probs: false`,
  `return_tokens: true`, `cache_prompt: true`, `stream: false`, and `response_fields` (only what we
  read comes back: no detokenized prompt, no settings echo).
- response (`tools/server/server-task.cpp:340`, `server_task_result_cmpl_final::to_json_non_oaicompat`):
  `tokens` (every sampled id, `server-context.cpp:1820` in `process_token`: pushed before any stop check),
  `completion_probabilities[i].{id, logprob}`, `stop_type` (`eos` | `word` | `limit` | `none`).

Logprobs: "raw". With `post_sampling_probs: false`, `populate_token_probs` (`server-context.cpp:1945`)
calls `get_token_probabilities` (`server-common.cpp:1550`): a softmax over the model's logits for the
whole vocabulary, before logit bias, temperature and top-k/top-p; the JSON carries `log(p)`
(`completion_token_output::logarithm`, `server-task.cpp:304`). Asking for these pre-sampling logits
also turns off backend sampling (`need_pre_sample_logits`, `server-context.cpp:1771`), so the
sampler runs on the same logits.

A gap in the server's record: a token that leaves the generated text in the middle of a UTF-8
character gets no `completion_probabilities` entry (`process_token` only calls `add_token` once the
text is complete, `server-context.cpp:1826-1856`), though it is in `tokens`. Such a token's logprob
is asked for separately: the same prefix (cached, so only the new tokens are read) is sent with
`n_predict: 1`, a `logit_bias` that forces the stop token (a special token, whose text is complete)
and `n_probs` 64, else the whole vocabulary; that raw top list holds the missing token's logprob.
Rare: emoji and other characters split over byte tokens.

Stop tokens: llama-server has no stop-token-id field. It ends a generation on any end-of-generation
token of the GGUF's vocabulary (`llama_vocab_is_eog`, `stop_type: eos`, `server-context.cpp:1933`),
keeping that id as the last of `tokens`; a chat template's end-of-turn (SmolLM2's `<|im_end|>`,
ChatML, Llama 3's `<|eot_id|>`) is one. A requested stop id that is not end-of-generation in the
GGUF is found in the returned ids and the generation cut after it (kept, finish `stop`): correct,
but the server went on generating until n_predict or an EOG (`stop` strings would stop it, but the
server then drops the stop word's logprobs, `server-context.cpp:2113-2120`).

Routing and abort: RemoteEngine's sticky replica; within a server, a request without `id_slot` goes
to the idle slot whose cached prompt shares the most with it (`--slot-prompt-similarity`), which is
the episode's own slot while it has one (`slot_prompt_similarity`, `server-context.cpp:1188`), and
an idle slot's state is kept in the host-memory prompt cache (`--cache-ram`) for its next turn.
Closing the connection cancels the task (the HTTP layer checks `is_connection_closed`,
`server-http.cpp:685`). Health: `GET /health` (200 ok, 503 while the model loads); doctor also reads
`GET /props` (slots, context per slot, model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx

from uniagent.errors import EngineError, UniAgentError
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.registry import EngineKind
from uniagent.models.remote.base import Dialect, RemoteEngine, generation
from uniagent.models.remote.config import RemoteConfig
from uniagent.models.remote.kind import doctor_rows, engine_options, parse_urls

if TYPE_CHECKING:
    from uniagent.models.config import ModelConfig
    from uniagent.models.registry import Row

_FINISH = {"eos": "stop", "word": "stop", "limit": "length", "none": "abort"}
_FIELDS = ["tokens", "completion_probabilities", "stop_type"]
_ALL_TOKENS = 1 << 20  # n_probs above the vocabulary size: the server returns every token


class LlamaCppDialect(Dialect):
    name = "llamacpp"
    generate_path = "/completion"
    health_path = "/health"
    logprobs = "raw"

    def request(self, prompt_ids: list[int], sampling: SamplingParams, call_id: str) -> dict[str, Any]:
        return {
            "prompt": prompt_ids,
            "n_predict": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_k": max(sampling.top_k, 0),
            "top_p": sampling.top_p,
            "samplers": ["temperature", "top_k", "top_p"],
            "seed": -1 if sampling.seed is None else sampling.seed,
            "n_probs": 1,
            "post_sampling_probs": False,
            "return_tokens": True,
            "cache_prompt": True,
            "stream": False,
            "response_fields": _FIELDS,
        }

    def response(self, data: Any, sampling: SamplingParams) -> Generation:
        """Token ids and logprobs; a token the server kept no probability for gets NaN, which
        `LlamaCppEngine` fills in before anyone sees the generation."""
        tokens = data["tokens"]
        probs = data["completion_probabilities"]
        if not isinstance(tokens, list) or not isinstance(probs, list) or len(probs) > len(tokens):
            raise ValueError("tokens / completion_probabilities missing or inconsistent")
        logprobs: list[float] = []
        j = 0
        for token in tokens:
            if j < len(probs) and probs[j]["id"] == token:
                logprobs.append(probs[j]["logprob"])
                j += 1
            else:
                logprobs.append(math.nan)
        if j != len(probs):
            raise ValueError("completion_probabilities name tokens that are not in `tokens`")
        finish = _FINISH.get(data["stop_type"], data["stop_type"])
        stops = set(sampling.stop_token_ids)
        cut = next((i for i, t in enumerate(tokens) if t in stops), None)
        if cut is not None and cut < len(tokens) - 1:  # a stop id the GGUF does not treat as EOG
            tokens, logprobs, finish = tokens[: cut + 1], logprobs[: cut + 1], "stop"
        known = [0.0 if math.isnan(x) else x for x in logprobs]
        checked = generation(tokens, known, finish)  # validates ids, finiteness, the reason
        return Generation(checked.token_ids, [float(x) for x in logprobs], checked.finish_reason)


class LlamaCppEngine(RemoteEngine):
    """`RemoteEngine` with llama-server's dialect, plus the logprobs the server left out (above)."""

    def __init__(
        self,
        urls: Sequence[str],
        config: RemoteConfig | None = None,
        *,
        timeout_s: float = 300.0,
        retries: int = 3,
    ) -> None:
        super().__init__(urls, LlamaCppDialect(), config, timeout_s=timeout_s, retries=retries)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> Generation:
        gen = await super().generate(prompt_ids, sampling, request_id)
        missing = [i for i, x in enumerate(gen.logprobs) if math.isnan(x)]
        if missing:
            replica = await self._route(request_id)
            forced = self._forced_token(sampling)
            for i in missing:
                prefix = [*prompt_ids, *gen.token_ids[:i]]
                gen.logprobs[i] = await self._score(replica.url, prefix, gen.token_ids[i], forced, request_id)
        return gen

    @staticmethod
    def _forced_token(sampling: SamplingParams) -> int:
        """A token whose own text is complete, so the server records its probabilities: the stop
        token (a special token, whose text is ASCII)."""
        if sampling.stop_token_ids:
            return sampling.stop_token_ids[0]
        raise EngineError(
            "llamacpp: the server kept no logprob for a generated token (a split UTF-8 character) "
            "and without a stop token id there is no token to score it with"
        )

    async def _score(self, url: str, prefix: list[int], token: int, forced: int, request_id: str) -> float:
        """The raw logprob of `token` after `prefix`: a one-token generation forced (logit bias) to
        `forced`, whose pre-sampling top list holds `token` (the top 64 first, else all tokens)."""
        where = f"{url}: request {request_id}: logprob of token {token}"
        for n_probs in (64, _ALL_TOKENS):
            body = {
                "prompt": prefix,
                "n_predict": 1,
                "temperature": 0.0,
                "samplers": ["temperature"],
                "logit_bias": [[forced, 1e6]],
                "n_probs": n_probs,
                "post_sampling_probs": False,
                "cache_prompt": True,
                "response_fields": ["completion_probabilities"],
            }
            data = await self._post(url, body, where)
            try:
                for entry in data["completion_probabilities"][0]["top_logprobs"]:
                    if entry["id"] == token and math.isfinite(entry["logprob"]):
                        return float(entry["logprob"])
            except (KeyError, IndexError, TypeError) as exc:
                raise EngineError(f"{where}: unusable answer ({exc}): {str(data)[:200]}") from exc
        raise EngineError(f"{where}: the server's probabilities do not include it")

    async def _post(self, url: str, body: dict[str, Any], where: str) -> Any:
        try:
            response = await self._client().post(url + "/completion", json=body, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise EngineError(f"{where}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise EngineError(f"{where}: HTTP {response.status_code}: {response.text[:200]}")
        return response.json()


def build_llamacpp_engine(urls: Sequence[str], config: ModelConfig | None = None) -> LlamaCppEngine:
    """An engine over llama-server replicas (`model.timeout_s`, `model.max_retries`, `model.remote`)."""
    if config is None:
        return LlamaCppEngine(list(urls))
    return LlamaCppEngine(list(urls), **engine_options(config))


async def _build(arg: str, config: ModelConfig) -> LlamaCppEngine:
    return build_llamacpp_engine(parse_urls(arg, LlamaCppDialect.name), config)


async def _doctor(arg: str, config: ModelConfig, quick: bool) -> list[Row]:
    """Health and (unless quick) a one-token generation per RemoteEngine, plus each replica's
    `/props`: slots, context per slot, model file."""
    rows = await doctor_rows(LlamaCppDialect, arg, config, quick)
    try:
        urls = parse_urls(arg, LlamaCppDialect.name)
    except UniAgentError:
        return rows
    async with httpx.AsyncClient(timeout=config.remote.health_timeout_s) as client:
        for url in urls:
            name = f"engine llamacpp {url} /props"
            try:
                props = (await client.get(url + "/props")).raise_for_status().json()
                settings = props.get("default_generation_settings", {})
                rows.append(
                    (
                        name,
                        True,
                        f"{props.get('total_slots', '?')} slots, n_ctx {settings.get('n_ctx', '?')} "
                        f"per slot, model {props.get('model_path', '?')}",
                    )
                )
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                rows.append((name, False, f"{type(exc).__name__}: {exc}"[:300]))
    return rows


KIND = EngineKind(
    name=LlamaCppDialect.name,
    usage="llamacpp:URL[,URL...]",
    token_level=True,
    build=_build,
    doctor=_doctor,
)
