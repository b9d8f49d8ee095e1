"""Record generations from any `TokenEngine` and replay them later, token-exact.

Replays make agent tests deterministic without a model, make benchmarks of the layers above the
engine independent of model speed (`delay_s` puts a fixed latency back in), and let a bad episode be
re-run step by step. The file format is JSONL, one `ReplayRecord` per line, so a recording can be
appended to, diffed and trimmed by hand.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from uniagent.errors import ConfigError, EngineError
from uniagent.jsonio import atomic_path
from uniagent.models.base import Generation, SamplingParams, TokenEngine
from uniagent.models.registry import EngineKind

if TYPE_CHECKING:
    from uniagent.models.config import ModelConfig

log = logging.getLogger(__name__)

MatchMode = Literal["request", "prompt"]


ANY_PROMPT = "*"
"""A record's `prompt_hash` that says: replay me by request and turn, whatever the prompt. For
scripted turns (tests, bench/runner.py) whose prompts cannot be known when the script is written
(observations hold timestamps, paths): nothing is hashed or compared for them, and they are not
in the prompt pool (`match="prompt"` cannot find them)."""


def prompt_hash(prompt_ids: list[int]) -> str:
    """Stable digest of a prompt, so recordings can omit long prompts and still be checked."""
    return hashlib.sha256(json.dumps(list(prompt_ids), separators=(",", ":")).encode()).hexdigest()


class _PromptHasher:
    """`prompt_hash` of one request's prompts, each computed from the previous one's when it extends
    it (an episode's prompt grows by a turn at a time): only the new ids are hashed, not the whole
    history per turn. Same digest as `prompt_hash` (sha256 of the ids' compact JSON), so recorded
    hashes stay valid."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.state = hashlib.sha256(b"[")

    def digest(self, prompt_ids: list[int]) -> str:
        n = len(self.ids)
        if len(prompt_ids) < n or prompt_ids[:n] != self.ids:
            self.ids, self.state, n = [], hashlib.sha256(b"["), 0
        new = prompt_ids[n:]
        if new:
            head = "," if n else ""
            self.state.update((head + ",".join(map(str, map(int, new)))).encode())
            self.ids.extend(new)
        final = self.state.copy()
        final.update(b"]")
        return final.hexdigest()


@dataclass
class ReplayRecord:
    """One recorded call: which request and turn, what prompt (ids or only their hash), what came back."""

    request_id: str
    generation: Generation
    turn: int = 0
    prompt_ids: list[int] | None = None
    prompt_hash: str = ""
    sampling: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.prompt_hash:
            if self.prompt_ids is None:
                raise ValueError(f"record for request {self.request_id!r} needs prompt_ids or prompt_hash")
            self.prompt_hash = prompt_hash(self.prompt_ids)

    def to_json(self, include_prompt: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "request_id": self.request_id,
            "turn": self.turn,
            "prompt_hash": self.prompt_hash,
        }
        if include_prompt and self.prompt_ids is not None:
            data["prompt_ids"] = self.prompt_ids
        if self.sampling is not None:
            data["sampling"] = self.sampling
        data["generation"] = {
            "token_ids": self.generation.token_ids,
            "logprobs": self.generation.logprobs,
            "finish_reason": self.generation.finish_reason,
        }
        if self.generation.versions is not None:
            data["generation"]["versions"] = self.generation.versions
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayRecord:
        gen = data["generation"]
        return cls(
            request_id=str(data["request_id"]),
            generation=Generation(
                list(gen["token_ids"]), list(gen["logprobs"]), gen["finish_reason"], gen.get("versions")
            ),
            turn=int(data.get("turn", 0)),
            prompt_ids=data.get("prompt_ids"),
            prompt_hash=data.get("prompt_hash", ""),
            sampling=data.get("sampling"),
        )


def load_records(path: str | os.PathLike[str]) -> list[ReplayRecord]:
    """Read a JSONL recording; a malformed line is an error that names the line."""
    records = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                records.append(ReplayRecord.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:
                raise EngineError(f"{path}:{number}: not a replay record ({exc})") from exc
    return records


def save_records(
    records: list[ReplayRecord], path: str | os.PathLike[str], include_prompts: bool = True
) -> None:
    """Write a JSONL recording atomically (a crash never leaves half a file behind)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record.to_json(include_prompts), ensure_ascii=False) + "\n")


def _copy(generation: Generation) -> Generation:
    versions = None if generation.versions is None else list(generation.versions)
    return Generation(
        list(generation.token_ids), list(generation.logprobs), generation.finish_reason, versions
    )


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


class ReplayEngine:
    """A `TokenEngine` that answers from recorded generations.

    `match="request"` replays each request_id's records in turn order (what an episode re-run needs);
    `match="prompt"` answers by prompt, in recorded order for repeated prompts (what a shuffled or
    re-batched run needs). With `strict=True` a prompt that differs from the recording, or a request
    with no records left, raises `EngineError`; without it, request mode falls back to prompt matching
    and prompt mode repeats the last recording of a prompt.
    """

    def __init__(
        self,
        records: list[ReplayRecord] | str | os.PathLike[str],
        *,
        match: MatchMode = "request",
        strict: bool = True,
        delay_s: float = 0.0,
    ) -> None:
        if match not in ("request", "prompt"):
            raise EngineError(f"ReplayEngine match must be 'request' or 'prompt', got {match!r}")
        self.records = load_records(records) if isinstance(records, str | os.PathLike) else list(records)
        self.match = match
        self.strict = strict
        self.delay_s = delay_s
        self.calls = 0
        self._by_request: dict[str, collections.deque[ReplayRecord]] = collections.defaultdict(
            collections.deque
        )
        self._by_prompt: dict[str, collections.deque[ReplayRecord]] = collections.defaultdict(
            collections.deque
        )
        self._last_by_prompt: dict[str, ReplayRecord] = {}
        self._turns: collections.Counter[str] = collections.Counter()
        self._hashers: dict[str, _PromptHasher] = collections.defaultdict(_PromptHasher)
        for record in sorted(self.records, key=lambda r: r.turn):  # stable: keeps file order within a turn
            self._by_request[record.request_id].append(record)
        for record in self.records:
            if record.prompt_hash != ANY_PROMPT:
                self._by_prompt[record.prompt_hash].append(record)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str], **options: Any) -> ReplayEngine:
        return cls(load_records(path), **options)

    def remaining(self) -> int:
        """Records not replayed yet (in the active match mode)."""
        pool = self._by_request if self.match == "request" else self._by_prompt
        return sum(len(queue) for queue in pool.values())

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> Generation:
        turn = self._turns[request_id]
        self._turns[request_id] += 1
        self.calls += 1
        if self.match == "request":
            record = self._next_for_request(list(prompt_ids), request_id, turn)
        else:
            record = self._next_for_prompt(list(prompt_ids), request_id, turn)
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        return _copy(record.generation)

    def _next_for_request(self, prompt_ids: list[int], request_id: str, turn: int) -> ReplayRecord:
        queue = self._by_request.get(request_id)
        if not queue:
            recorded = sum(1 for r in self.records if r.request_id == request_id)
            if self.strict:
                raise EngineError(
                    f"replay: no recorded generation left for request {request_id!r} turn {turn} "
                    f"({recorded} recorded for it)"
                )
            return self._next_for_prompt(prompt_ids, request_id, turn)
        record = queue.popleft()
        if record.prompt_hash == ANY_PROMPT:
            return record
        self._discard_from_prompt_pool(record)
        digest = self._hashers[request_id].digest(prompt_ids)
        if not queue:  # the request's last turn: its prefix is not needed again
            self._hashers.pop(request_id, None)
        if record.prompt_hash != digest:
            message = self._mismatch(record, prompt_ids, request_id, turn)
            if self.strict:
                raise EngineError(message)
            log.warning("%s; replaying the recording anyway (strict=False)", message)
        return record

    def _next_for_prompt(self, prompt_ids: list[int], request_id: str, turn: int) -> ReplayRecord:
        digest = self._hashers[request_id].digest(prompt_ids)
        queue = self._by_prompt.get(digest)
        if queue:
            record = queue.popleft()
            self._last_by_prompt[digest] = record
            queue_for_request = self._by_request.get(record.request_id)
            if queue_for_request and record in queue_for_request:
                queue_for_request.remove(record)
            return record
        if digest in self._last_by_prompt and not self.strict:
            return self._last_by_prompt[digest]
        state = "all its recordings were used" if digest in self._last_by_prompt else "it was never recorded"
        raise EngineError(
            f"replay: no recorded generation for the prompt of request {request_id!r} turn {turn} "
            f"({len(prompt_ids)} tokens, hash {digest[:12]}): {state}"
        )

    def _discard_from_prompt_pool(self, record: ReplayRecord) -> None:
        """Take the replayed record itself out of its prompt's queue. By identity: `in` and
        `remove` compare records field by field (generations, prompts), and the samples of one
        task share a prompt, so that was a scan of equal-looking records every turn."""
        queue = self._by_prompt.get(record.prompt_hash)
        if queue:
            for i, queued in enumerate(queue):
                if queued is record:
                    del queue[i]
                    break
        self._last_by_prompt[record.prompt_hash] = record

    @staticmethod
    def _mismatch(record: ReplayRecord, prompt_ids: list[int], request_id: str, turn: int) -> str:
        where = f"replay: request {request_id!r} turn {turn}: prompt differs from the recording"
        if record.prompt_ids is None:
            return f"{where} (got {len(prompt_ids)} tokens; hashes differ, recording holds no ids)"
        index = _first_difference(record.prompt_ids, prompt_ids)
        return (
            f"{where} (recorded {len(record.prompt_ids)} tokens, got {len(prompt_ids)}; "
            f"first difference at token {index})"
        )


class RecordingEngine:
    """Wraps any `TokenEngine`, records every successful call, and saves what `ReplayEngine` loads."""

    def __init__(self, inner: TokenEngine) -> None:
        self.inner = inner
        self.records: list[ReplayRecord] = []
        self._turns: collections.Counter[str] = collections.Counter()
        self._hashers: dict[str, _PromptHasher] = collections.defaultdict(_PromptHasher)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> Generation:
        turn = self._turns[request_id]  # taken at call time: concurrent calls keep their call order
        self._turns[request_id] += 1
        prompt = list(prompt_ids)
        generation = await self.inner.generate(prompt, sampling, request_id)
        self.records.append(
            ReplayRecord(
                request_id=request_id,
                generation=_copy(generation),
                turn=turn,
                prompt_ids=prompt,
                sampling=sampling.model_dump(),
            )
        )
        return generation

    def save(self, path: str | os.PathLike[str], include_prompts: bool = True) -> None:
        """Write the JSONL recording; without prompts only their hashes are kept (smaller, still checked)."""
        save_records(sorted(self.records, key=lambda r: (r.request_id, r.turn)), path, include_prompts)


async def _build(arg: str, config: ModelConfig) -> ReplayEngine:
    if not os.path.exists(arg):
        raise ConfigError(f"model spec replay:{arg}: the file does not exist")
    # Records are found by request id `INSTANCE#SAMPLE` and turn, else (a gateway session, a prompt
    # that differs) by prompt; a differing prompt is replayed anyway with a warning.
    return ReplayEngine.from_jsonl(arg, match="request", strict=False, delay_s=config.replay_delay_s)


async def _doctor(arg: str, config: ModelConfig, quick: bool) -> list[tuple[str, bool | None, str]]:
    name = f"engine replay:{arg}"
    try:
        records = load_records(arg)
    except Exception as exc:
        return [(name, False, (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200])]
    return [(name, True, f"{len(records)} recorded generations")]


# `replay:FILE`: recorded generations (a RecordingEngine's JSONL), token level.
KIND = EngineKind(
    name="replay",
    usage="replay:FILE",
    token_level=True,
    build=_build,
    doctor=_doctor,
    fresh_request_ids=False,
)
