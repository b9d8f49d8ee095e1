"""Drift by kind: a bug of ours, or sampled text that a fresh encoding would split differently.

`ChatCodec.drift` finds the first token where a segment departs from a full render of its
messages. That mixes two things:

- **sampled**: the model sampled a non-canonical split of its own text (`" wor" "ld"` where the
  tokenizer would write `" world"`). Decoding the sampled ids gives exactly the text the template
  renders; only a re-encoding differs. Harmless for us (the record keeps the sampled ids and the
  trainer sees what the engine produced) but fatal for a peer that re-renders the history.
- **bookkeeping**: anything else: context tokens (prompt, tool results, turn glue) that differ
  from the template's render, a missing or extra token, or a model span whose *text* the
  template renders differently. Our token record then disagrees with the conversation: a bug.

- **template**: the chat template is not append-only for this history (it shows an earlier
  turn differently once more messages follow, e.g. Qwen3 drops earlier reasoning), and the
  difference lies where it stops being so. With `model.history: exact` the model keeps seeing its
  own tokens, so this is expected, not a bug; `model.history: template` avoids it.

`drift_report` classifies the first difference and, after a sampled one, re-aligns the rest of
the sequence on the text so that a later bookkeeping error is not hidden behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from uniagent.errors import TemplateError
from uniagent.tokens.codec import ChatCodec
from uniagent.tokens.trajectory import Trajectory

MERGE_SLACK = 3
"""Context tokens next to a model span that a re-encoding may merge with the model's text (a
whitespace run across the boundary, e.g. the generation prompt's newline and a sampled newline)."""


class DriftReport(NamedTuple):
    """`index` in `trajectory.token_ids` (None: the segment equals the render) and its kind."""

    index: int | None
    kind: str | None


def drift_report(
    codec: ChatCodec,
    messages: list[dict[str, Any]],
    trajectory: Trajectory,
    tools: list[dict[str, Any]] | None = None,
    prompt_mask: Sequence[int] | None = None,
) -> DriftReport:
    """Where `trajectory` departs from a full render of `messages`, and whether it matters.

    `messages` and `tools` are what the template sees (as for `ChatCodec.drift`). `prompt_mask`
    marks prompt tokens the model generated in an earlier segment (a rollback keeps them); by
    default the prompt is all context. The index is the first bookkeeping difference if there is
    one, else the first sampled retokenization. Raises `TemplateError` when the messages cannot
    be rendered.
    """
    ids = trajectory.token_ids
    first = codec.drift(messages, ids, tools)
    if first is None:
        return DriftReport(None, None)
    ends_with_assistant = bool(messages) and messages[-1].get("role") == "assistant"
    reference = codec.encode(codec.render(messages, tools, add_generation_prompt=not ends_with_assistant))
    if prompt_mask is not None and len(prompt_mask) != len(trajectory.prompt_ids):
        raise ValueError(
            f"prompt_mask has {len(prompt_mask)} entries for {len(trajectory.prompt_ids)} prompt ids"
        )
    mask = [*(prompt_mask or [0] * len(trajectory.prompt_ids)), *trajectory.response_mask]
    bookkeeping, sampled, in_render = _align(codec, reference, ids, mask, ends_with_assistant)
    if bookkeeping is not None:
        rewrites = template_rewrites_at(codec, messages, tools)
        # compared where the render is (a sampled split before it shifts the running indices)
        if rewrites is not None and in_render >= rewrites:
            return DriftReport(bookkeeping, "template")
        return DriftReport(bookkeeping, "bookkeeping")
    if sampled is not None:
        return DriftReport(sampled, "sampled")
    return DriftReport(first, "bookkeeping")  # not reached: a difference is always one or the other


def template_rewrites_at(
    codec: ChatCodec, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> int | None:
    """The token offset where the template stops being append-only for `messages` (the render of a
    history is not a prefix of the render with one more message), or None when it is append-only.
    Renders every prefix: only called when there is drift to explain."""
    before: str | None = None
    for k in range(1, len(messages) + 1):
        try:
            after = codec.render(messages[:k], tools, add_generation_prompt=False)
        except TemplateError:  # a prefix the template refuses alone (tools but no user yet, say)
            continue
        if before is not None and not after.startswith(before):
            same = 0
            while same < min(len(before), len(after)) and before[same] == after[same]:
                same += 1
            return max(0, len(codec.encode(after[:same])) - MERGE_SLACK)
        before = after
    return None


def episode_drift(segments: Sequence[Trajectory | dict[str, Any]]) -> DriftReport:
    """An episode's drift from its segments' (as set by `drift_report`; Trajectory objects or
    their dicts): bookkeeping if any segment has it, else template, else sampled; the index is
    that segment's. Drift without a kind (a record from before kinds) counts as bookkeeping."""
    found = [_drift_of(seg) for seg in segments]
    found = [(index, kind or "bookkeeping") for index, kind in found if index is not None]
    for want in ("bookkeeping", "template", "sampled"):
        for index, kind in found:
            if kind == want:
                return DriftReport(index, kind)
    return DriftReport(None, None)


def _drift_of(seg: Trajectory | dict[str, Any]) -> tuple[int | None, str | None]:
    if isinstance(seg, dict):
        return seg.get("drift"), seg.get("drift_kind")
    return seg.drift, seg.drift_kind


def _align(
    codec: ChatCodec, ref: list[int], ids: list[int], mask: list[int], ends_with_assistant: bool
) -> tuple[int | None, int | None, int]:
    """Walk `ids` against `ref`; returns (first bookkeeping index, first sampled index, the index
    in `ref` the bookkeeping difference stands at).

    Equal tokens are skipped. At a difference, the model run it falls in (or the model run a
    context tail of at most MERGE_SLACK tokens leads into) is decoded and looked up in `ref` as
    text; found, it is a sampled retokenization and the walk continues after it, allowing the
    re-encoding to spill up to MERGE_SLACK tokens into the following context. Anything else is
    bookkeeping; in a model run whose text departs from the render part-way (gpt-oss ends a past
    final answer with <|end|>, not the sampled <|return|>), at the token where the text departs,
    so that a sampled split before it is not taken for the departure.
    """
    n, k, r = len(ids), 0, 0
    sampled: int | None = None
    while True:
        while k < n and r < len(ref) and ids[k] == ref[r]:
            k += 1
            r += 1
        if k == n:
            if r < len(ref) and not ends_with_assistant:
                return n, sampled, r  # the render goes on: tokens we never appended
            return None, sampled, r
        if r == len(ref):
            return k, sampled, r  # tokens the render does not have
        end = _run_end(mask, k)
        if not mask[k]:
            if end - k > MERGE_SLACK or end == n:
                return k, sampled, r  # a context token the template would not write
            end = _run_end(mask, end)  # a short context tail merged into the next model run
        spill_limit = _run_end(mask, end) if end < n else n
        found: tuple[int, int] | None = None
        text_only: int | None = None
        for b in range(end, min(end + MERGE_SLACK, spill_limit) + 1):
            e = _find_text(codec, ref, r, codec.decode(ids[k:b]))
            if e is None:
                continue
            if b == end:
                text_only = e
            if b == n or (e < len(ref) and ref[e] == ids[b]) or e == len(ref):
                found = (b, e)
                break
        if found is None:
            if text_only is None:  # the model's text is not what the template renders
                b, e = _text_departs(codec, ref, r, ids, k, end)
                if b == k:
                    return k, sampled, r
                return b, (k if sampled is None else sampled), e
            return end, (k if sampled is None else sampled), text_only  # the context after it differs
        if sampled is None:
            sampled = k
        k, r = found


def _text_departs(
    codec: ChatCodec, ref: list[int], r: int, ids: list[int], k: int, end: int
) -> tuple[int, int]:
    """Where the text of the model run `ids[k:end]` departs from the render's text at `ref[r:]`:
    the first token of each that reaches past their common text, (b, e); (k, r) when the first
    token already departs. Decoded lengths grow with the end, so binary searches find them."""
    run_text = codec.decode(ids[k:end])
    ref_text = codec.decode(ref[r : r + len(run_text.encode("utf-8")) + 2])
    same = 0
    while same < min(len(run_text), len(ref_text)) and run_text[same] == ref_text[same]:
        same += 1
    return _first_past(codec, ids, k, end, same), _first_past(codec, ref, r, len(ref), same)


def _first_past(codec: ChatCodec, ids: list[int], start: int, stop: int, chars: int) -> int:
    """The first index `b` in [start, stop) whose token takes the decoded text past `chars`."""
    lo, hi = start, stop
    while lo < hi:
        mid = (lo + hi) // 2
        if len(codec.decode(ids[start : mid + 1])) > chars:
            hi = mid
        else:
            lo = mid + 1
    return min(lo, stop - 1) if stop > start else start


def _run_end(mask: list[int], k: int) -> int:
    """End of the run of equal mask values that starts at or contains `k`."""
    end = k
    while end < len(mask) and mask[end] == mask[k]:
        end += 1
    return end


def _find_text(codec: ChatCodec, ref: list[int], start: int, text: str) -> int | None:
    """The end `e` with `decode(ref[start:e]) == text`, or None.

    A text of b bytes is at most b tokens, so the search is bounded; the decoded length grows
    with `e`, so a binary search finds the candidate and its neighbours settle multi-byte
    characters split across tokens.
    """
    if not text:
        return start
    hi = min(len(ref), start + len(text.encode("utf-8")) + 2)
    lo, top = start, hi
    while lo < top:
        mid = (lo + top) // 2
        if len(codec.decode(ref[start:mid])) >= len(text):
            top = mid
        else:
            lo = mid + 1
    for e in range(max(start, lo - 2), min(hi, lo + 3) + 1):
        if codec.decode(ref[start:e]) == text:
            return e
    return None
