"""Secrets never reach a byte uniagent writes: the store, the exports, the logs, the APIs.

Values of environment variables whose names look secret (KEY, TOKEN, SECRET, PASSWORD,
CREDENTIAL, AUTH), and any extra values a caller knows about, are replaced by `MASK` wherever
they appear in text. Text is not enough: a trajectory stores token ids, and decoding the ids of
a secret the model echoed (or a tool printed) gives it back. So a trajectory is redacted at
the token level too: every token that overlaps a secret in the decoded text (a secret usually
spans several tokens) is replaced by the tokens of the same text with the secret masked, as
context (mask 0, logprob 0.0) in a span of role `redacted`. Such a token record is no longer
what the policy produced, so the episode is marked not trainable
(`metrics.untrainable_reason = "secret_redacted"`).

This module sits at the bottom (it needs only `tokens`), so the gateway, the runner and the
dashboard share it.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from uniagent.tokens.trajectory import Trajectory, TurnSpan

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)
# Names that match but hold where something is, not a secret (XAUTHORITY, SSH_AUTH_SOCK,
# GOOGLE_APPLICATION_CREDENTIALS=/path, KEYRING_DIR ...): masking them would cost training
# data, since an episode whose tokens held a "secret" is no longer trainable.
_LOCATION_NAME = re.compile(r"(_SOCK|_PATH|_FILE|_DIR|_HOME|^XAUTHORITY)$", re.I)


def env_secrets(env: dict[str, str]) -> set[str]:
    """Values of environment variables that look secret, minus locations (paths, sockets)."""
    return {
        v
        for k, v in env.items()
        if _SECRET_NAME.search(k)
        and len(v) >= 8
        and not _LOCATION_NAME.search(k)
        and not (v.startswith("/") and os.path.exists(v))
    }


def setting_secrets(settings: Any) -> list[str]:
    """String values under secret-looking names anywhere in a settings tree: a sandbox config's
    `auth_token`, its `env: {GITHUB_TOKEN: ...}`, a nested `inner` sandbox's."""
    if isinstance(settings, BaseModel):  # a typed section: what the user set
        settings = settings.model_dump(exclude_unset=True)
    if isinstance(settings, dict):
        found = []
        for key, value in settings.items():
            name = str(key)
            if isinstance(value, str) and _SECRET_NAME.search(name) and not _LOCATION_NAME.search(name):
                found.append(value)
            else:
                found.extend(setting_secrets(value))
        return found
    if isinstance(settings, list | tuple):
        return [v for item in settings for v in setting_secrets(item)]
    return []


MASK = "[REDACTED]"
_NUMBERS = {int, float, bool, type(None)}
REDACTED_ROLE = "redacted"
UNTRAINABLE_REASON = "secret_redacted"


class Redactor:
    def __init__(
        self,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        tokenizer: Any = None,
    ) -> None:
        """`tokenizer`: a Hugging Face tokenizer (or a codec with `.tokenizer`), or a function
        that returns one when a trajectory first needs it (loading costs time: only on demand)."""
        env = dict(os.environ if env is None else env)
        values = env_secrets(env)
        values |= {v for v in extra or [] if v and len(v) >= 4}
        self.values = sorted(values, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in self.values)) if self.values else None
        self._tokenizer = tokenizer
        self._pieces: dict[int, tuple[Any, dict[int, str]]] = {}
        self._lock = threading.Lock()

    # -- text ----------------------------------------------------------------------------
    def text(self, s: str) -> str:
        return self._pattern.sub(MASK, s) if self._pattern and s else s

    def found(self, s: str) -> bool:
        return bool(self._pattern and s and self._pattern.search(s))

    def data(self, obj: Any) -> Any:
        """`obj` with every string redacted, as a new structure; `obj` itself when there is no
        secret to look for. A list of numbers (a trajectory's ids, masks, logprobs: thousands
        per episode) is copied whole, not walked item by item."""
        if self._pattern is None:
            return obj
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {k: self.data(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            if set(map(type, obj)) <= _NUMBERS:
                return list(obj)
            return [self.data(v) for v in obj]
        return obj

    # -- tokens --------------------------------------------------------------------------
    def token_spans(self, pieces: list[str]) -> list[tuple[int, int]]:
        """Token ranges `[i, j)` that overlap a secret in `"".join(pieces)`, merged.

        `pieces[k]` is the text of token k alone; a secret split across tokens (the usual
        case) is found in the joined text and maps back to every token it touches.
        """
        if self._pattern is None:
            return []
        starts, pos = [], 0
        for piece in pieces:
            starts.append(pos)
            pos += len(piece)
        text = "".join(pieces)
        ranges: list[tuple[int, int]] = []
        for m in self._pattern.finditer(text):
            i = bisect.bisect_right(starts, m.start()) - 1
            j = bisect.bisect_right(starts, m.end() - 1)
            if ranges and i < ranges[-1][1]:
                ranges[-1] = (ranges[-1][0], max(ranges[-1][1], j))
            else:
                ranges.append((i, j))
        return ranges

    def trajectory(self, traj: dict[str, Any], tokenizer: Any = None) -> dict[str, Any] | None:
        """`traj` (a `Trajectory.to_dict()`) with no secret recoverable by decoding its ids.

        Returns `traj` itself when it holds no secret; a rebuilt copy with `secret_redacted:
        True` when it did (lengths, mask, logprobs, spans and drift kept consistent); None when
        a secret survives token-level replacement (a tokenizer whose per-token texts do not add
        up to its decode): then no token record may be kept at all.
        """
        if self._pattern is None or not traj:
            return traj
        tok = self._resolve(tokenizer)
        prompt, response = list(traj.get("prompt_ids") or []), list(traj.get("response_ids") or [])
        ids = prompt + response
        pieces = self._texts(tok, ids)
        ranges = [r for a, b in self.token_spans(pieces) for r in _split(a, b, len(prompt))]
        if not ranges:
            return None if self._leaks(tok, prompt, response) else traj
        old = Trajectory.from_dict(traj)
        text = "".join(pieces)
        offsets = [0]
        for piece in pieces:
            offsets.append(offsets[-1] + len(piece))
        span_of = [0] * len(response)
        for k, s in enumerate(old.spans):
            span_of[s.start : s.end] = [k] * (s.end - s.start)
        new_prompt: list[int] = []
        # Response items: (id, mask, logprob, key, version); consecutive equal keys form one span.
        items: list[tuple[int, int, float, tuple[Any, ...], int]] = []
        versions = old.response_versions if old.versions_known else [-1] * len(response)
        where = [0] * (len(ids) + 1)  # old index -> new index (for drift)
        cut = dict(ranges)
        k = 0
        while k < len(ids):
            end = cut.get(k)
            if end is not None:
                replacement = _encode(tok, self.text(text[offsets[k] : offsets[end]]))
            if k < len(prompt):
                where[k] = len(new_prompt)
                if end is None:
                    new_prompt.append(ids[k])
                else:
                    new_prompt.extend(replacement)
            else:
                r = k - len(prompt)
                where[k] = len(prompt) + len(items)  # fixed up below once the prompt is known
                if end is None:
                    key = ("span", span_of[r])
                    items.append((ids[k], old.response_mask[r], old.response_logprobs[r], key, versions[r]))
                else:
                    turn = old.spans[span_of[r]].turn if old.spans else 0
                    items.extend((t, 0, 0.0, ("redacted", k, turn), -1) for t in replacement)
            if end is not None:
                where[k + 1 : end] = [where[k]] * (end - k - 1)
                k = end
            else:
                k += 1
        shift = len(new_prompt) - len(prompt)
        where = [w + shift if i >= len(prompt) else w for i, w in enumerate(where)]
        where[len(ids)] = len(new_prompt) + len(items)
        spans: list[TurnSpan] = []
        for n, (_, _, _, key, _) in enumerate(items):
            if spans and items[n - 1][3] == key:
                spans[-1].end = n + 1
                continue
            if key[0] == "redacted":
                spans.append(TurnSpan(n, n + 1, "context", key[2], REDACTED_ROLE))
            else:
                s = old.spans[key[1]]
                spans.append(TurnSpan(n, n + 1, s.kind, s.turn, s.role))
        new = Trajectory(
            prompt_ids=new_prompt,
            response_ids=[i[0] for i in items],
            response_mask=[i[1] for i in items],
            response_logprobs=[i[2] for i in items],
            response_versions=[i[4] for i in items] if old.versions_known else [],
            spans=spans,
            num_turns=old.num_turns,
            drift=None if old.drift is None else where[min(int(old.drift), len(ids))],
            finish_reasons=list(old.finish_reasons),
            reason=old.reason,
            chain=old.chain,
        )
        new.validate()
        if self._leaks(tok, new.prompt_ids, new.response_ids):
            return None
        return {**traj, **new.to_dict(), "secret_redacted": True}

    def result(self, result: dict[str, Any], tokenizer: Any = None) -> dict[str, Any]:
        """An `EpisodeResult.to_dict()` as it may be stored: text redacted, and its token segments
        too; an episode whose tokens had to change is marked not trainable, with the reason."""
        out = self.data(result)
        if self._pattern is None:
            return out
        changed = dropped = False
        for key in ("segments", "trajectory"):
            value = out.get(key)
            trajs = value if isinstance(value, list) else [value] if value else []
            cleaned = []
            for traj in trajs:
                clean = self.trajectory(traj, tokenizer)
                changed |= clean is not traj
                dropped |= clean is None
                if clean is not None:
                    cleaned.append(clean)
            if key == "segments" and value is not None:
                out[key] = cleaned
            elif value:
                out[key] = cleaned[0] if cleaned else None
        if not changed:
            return out
        out["trainable"] = False
        metrics = out["metrics"] = dict(out.get("metrics") or {})
        metrics["untrainable_reason"] = UNTRAINABLE_REASON
        if dropped:
            metrics["trajectory_dropped"] = "a secret could not be removed token by token"
        return out

    def episode(self, result: Any, tokenizer: Any = None) -> Any:
        """An `EpisodeResult` redacted like `result()`, as a new object: for a trainer, which trains
        on results in memory (the verl loop, the local trainer) rather than on stored rows. When its
        tokens had to change, `metrics.untrainable_reason` makes it not trainable."""
        if self._pattern is None:
            return result
        clean = self.result(result.to_dict(), tokenizer)
        segments = result.segments
        if clean.get("metrics", {}).get("untrainable_reason") == UNTRAINABLE_REASON:
            segments = [Trajectory.from_dict(t) for t in clean.get("segments") or []]
        reward = result.reward
        if reward is not None:
            reward = dataclasses.replace(reward, details=clean["reward"]["details"])
        return dataclasses.replace(
            result,
            messages=clean["messages"],
            segments=segments,
            reward=reward,
            metrics=clean["metrics"],
            patch=clean["patch"],
            answer=clean["answer"],
            error=clean["error"],
        )

    # -- helpers -------------------------------------------------------------------------
    def _resolve(self, tokenizer: Any) -> Any:
        if tokenizer is None:
            with self._lock:
                if self._tokenizer is not None and not hasattr(self._tokenizer, "decode"):
                    self._tokenizer = self._tokenizer()  # a loader: load once, on first need
                tokenizer = self._tokenizer
        elif not hasattr(tokenizer, "decode"):
            tokenizer = tokenizer()
        if tokenizer is None:
            raise ValueError("redacting token ids needs the tokenizer that made them")
        return getattr(tokenizer, "tokenizer", tokenizer)  # a ChatCodec carries its tokenizer

    def _texts(self, tok: Any, ids: list[int]) -> list[str]:
        """Per-token text, cached per tokenizer and id."""
        with self._lock:
            _, cache = self._pieces.setdefault(id(tok), (tok, {}))  # holds tok: its id stays its own
            for i in set(ids) - cache.keys():
                cache[i] = tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            return [cache[i] for i in ids]

    def _leaks(self, tok: Any, prompt: list[int], response: list[int]) -> bool:
        """Whether a decode of the ids shows a secret (the check an attacker would make): the
        whole sequence, with and without special tokens (they could separate a secret's parts),
        and the response alone."""
        for ids, skip in ((prompt + response, False), (prompt + response, True), (response, False)):
            text = tok.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            if ids and self.found(text):
                return True
        return False


def _split(a: int, b: int, boundary: int) -> list[tuple[int, int]]:
    """A token range cut where the prompt ends (each part is rebuilt in its own list)."""
    return [(a, boundary), (boundary, b)] if a < boundary < b else [(a, b)]


def _encode(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


_SHARED_LOCK = threading.Lock()
_SHARED: dict[tuple[int, tuple[str, ...]], Redactor] = {}


def shared_redactor(extra: list[str], tokenizer: Any) -> Redactor:
    """A redactor for this process's environment as it is now plus `extra`, reused while the secrets
    and the tokenizer stay the same, so its per-token texts stay cached across episodes (a verl worker
    builds one agent loop per sample). Also redacts this process's log records from now on."""
    fresh = Redactor(extra=extra, tokenizer=tokenizer)
    key = (id(tokenizer), tuple(fresh.values))  # the redactor holds the tokenizer: its id stays its own
    with _SHARED_LOCK:
        if len(_SHARED) > 16:  # secrets that keep changing: do not grow without bound
            _SHARED.clear()
        redactor = _SHARED.setdefault(key, fresh)
    redact_logs(redactor)
    return redactor


# -- logs ----------------------------------------------------------------------------------
_LOG_LOCK = threading.Lock()
_LOG: dict[str, Any] = {"values": set(), "redactor": None}


def redact_logs(redactor: Redactor) -> None:
    """Redact every log record made in this process from now on with `redactor`'s secrets too.

    Done where records are made (the record factory), so it holds whatever handlers and
    formatters are configured later: message, arguments and traceback text.
    """
    with _LOG_LOCK:
        values = _LOG["values"] | set(redactor.values)
        if values == _LOG["values"]:
            return
        if _LOG["redactor"] is None:
            logging.setLogRecordFactory(_redacting_factory(logging.getLogRecordFactory()))
        _LOG["values"], _LOG["redactor"] = values, Redactor(extra=sorted(values), env={})


def _redacting_factory(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        redactor: Redactor | None = _LOG["redactor"]
        if redactor is None:
            return record
        try:
            msg = record.getMessage()
        except Exception:  # a malformed call: logging reports it itself later
            return record
        if redactor.found(msg):
            record.msg, record.args = redactor.text(msg), None
        if record.exc_info:
            exc = logging.Formatter().formatException(record.exc_info)
            if redactor.found(exc):
                record.exc_text = redactor.text(exc)
        return record

    return factory
