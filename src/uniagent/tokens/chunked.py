"""Encode rendered chat text piece by piece between special tokens, each piece memoised.

Why: a fast tokenizer splits its input at its added (special) tokens first and tokenizes the
text between them independently, so the ids of a rendered conversation are the ids of its pieces
laid end to end. The same pieces come back again and again: the system prompt with its tool
schemas in every episode, a task's prompt in every sample of its group, and every piece of an
episode once more when its drift is checked against a full render at the end (the largest item
in the runner's profile at 1,000 episodes: 28 % of its samples). Memoising the pieces makes those
repeats free.

Exact or off: it is used only for a tokenizer whose added tokens strip nothing around them and
take no part in normalisation (as for every chat model we know), and only after it reproduces
the plain encode on a probe. Anything else keeps the plain encode.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

CACHE_PIECES = 16384
"""Pieces kept (least recently used out): a few per turn, so even 1,000 episodes in flight keep
theirs from the first turn until their drift check."""
MAX_CACHED_CHARS = 65536
"""Longer pieces (a huge tool output) are encoded without being kept."""
PROBE = (
    "<|x|>system\nYou are\n  helpful.<|y|>\n<|x|>user\n ok <|y|> <|y|>\n\n<|x|>assistant\n"
    'def f(a):\n\treturn a  # é ü 你好\n<|y|><|x|>tool\n{"k": 1}\n<|y|>'
)


def plain_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return encode


def chunked_encoder(tokenizer: Any) -> Callable[[str], list[int]] | None:
    """A memoising encoder equal to `plain_encoder(tokenizer)`, or None where that is not sure."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "get_added_tokens_decoder"):
        return None
    added = list(backend.get_added_tokens_decoder().items())
    if not added or any(t.lstrip or t.rstrip or t.single_word or t.normalized for _, t in added):
        return None
    ids = {t.content: i for i, t in added}
    split = re.compile("(" + "|".join(map(re.escape, sorted(ids, key=len, reverse=True))) + ")")

    @functools.lru_cache(maxsize=CACHE_PIECES)
    def piece(text: str) -> tuple[int, ...]:
        return tuple(backend.encode(text, add_special_tokens=False).ids)

    def encode(text: str) -> list[int]:
        out: list[int] = []
        for part in split.split(text):
            if not part:
                continue
            special = ids.get(part)
            if special is not None:
                out.append(special)
            elif len(part) > MAX_CACHED_CHARS:
                out.extend(backend.encode(part, add_special_tokens=False).ids)
            else:
                out.extend(piece(part))
        return out

    plain = plain_encoder(tokenizer)
    names = sorted(ids, key=ids.get)  # type: ignore[arg-type]
    start, end = names[min(1, len(names) - 1)], names[min(2, len(names) - 1)]
    probe = PROBE.replace("<|x|>", start).replace("<|y|>", end)
    if encode(probe) != plain(probe):
        return None
    piece.cache_clear()
    return encode
