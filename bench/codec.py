"""Cost of appending turn k of an agent conversation: ChatCodec vs full re-render vs verl, cold and warm.

A simulated 100-turn agent episode (about 30K tokens; bench/codec_conversation.py) on the real
SmolLM2 tokenizer and chat template. The figure of interest is the cost of getting the token ids to
append after the model's turn k, i.e. for the tool result k plus the next generation prompt:

* ``codec``         -- ``ChatCodec.continuation_ids([tool_k])`` (uniagent.tokens): renders only
                       the new message behind a probe turn, never the history.
* ``full_rerender`` -- ``codec.encode(codec.render(history_k, add_generation_prompt=True))``:
                       render and tokenize the whole conversation at turn k.
* ``verl``          -- verl 0.9.1's Continuous Token builder (the one its ToolAgentLoop uses),
                       ``tokenize_context_incremental_messages(previous, updated)``: the ids to
                       append (like for like with ``codec``).
* ``verl_merge``    -- the body of verl's ``AgentLoopBase.ct_merge_context_msg`` minus the
                       executor hop: ``merge_context_tokens`` (which also copies the running ids)
                       plus ``align_response_metadata``, i.e. what ToolAgentLoop pays per tool turn.

Each method is timed two ways (``warmth``), at turns k = 1, 10, 25, 50, 100, after one warm-up call:

* ``cold``: every repeat gets fresh tool text (every tool result in the history carries a line
  unique to that repeat, ``[done in N ms]``, a few tokens: the same length class), so no memo can
  hit: the codec's piece memo (uniagent/tokens/chunked.py) tokenizes the new text as a real
  episode's new tool result is, and the full re-render tokenizes the whole history;
* ``warm``: the same input every repeat, so the memo holds every piece (what a drift check or a
  group's shared prompt costs).

verl keeps no memo: its cold and warm figures differ only by noise. Each figure is the median with
``min``, ``max`` and every ``runs`` value (microseconds) of its repeats. The ratios at the last turn
(``full_rerender_vs_codec``, ``verl_vs_codec``, ``verl_merge_vs_codec``) are given per warmth; the
goals hold on the cold figures (what an episode pays for new text): the codec no slower than verl
(``verl_vs_codec`` >= 1) and at least 20x cheaper than a full re-render at turn 100; the warm ratios
are for information. The script also times a whole episode per method (each tool result new to the
codec; the full re-render's history memoised from the turns before), and checks that the codec's
running ids (first prompt + simulated generated assistant tokens ending in ``<|im_end|>`` + each
continuation) equal the full render of the last turn token for token; verl's running ids get the
same check, for information. It exits 1 when a goal is missed or the codec is not exact.

Output: one JSON object per line on stdout (keys ``bench``, ``figure``, ``value``, ``unit`` plus
context). Logs go to stderr. Runs in about two minutes on 2 CPU cores:

    .venv/bin/python bench/codec.py
    .venv/bin/python bench/codec.py --turns 3 --repeats 2 --repeats-full 2   # smoke size, seconds
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from codec_conversation import TURNS, Messages, build_conversation
from common import emit, spread
from uniagent.models.loading import load_tokenizer, smollm2_source
from uniagent.tokens import ChatCodec

BENCH = "codec_append"
CHECKPOINTS = (1, 10, 25, 50, 100)
REPEATS_CHEAP = 15  # per-append methods whose cost does not grow with the history
REPEATS_FULL = 7  # the full re-render, whose cost grows with the history
WARMTHS = ("cold", "warm")
GOALS = {"full_rerender_vs_codec": 20.0, "verl_vs_codec": 1.0}  # on the cold figures at the last turn
_fresh = itertools.count(1)


def fresh_line() -> str:
    """A line no earlier call returned: appended to a tool result, it makes a piece no memo holds."""
    return f"[done in {next(_fresh)} ms]\n"


def with_line(messages: Messages, line: str) -> Messages:
    """`messages` with `line` appended to every tool result."""
    return [{**m, "content": m["content"] + line} if m["role"] == "tool" else m for m in messages]


def time_us(call: Callable[[Any], Any], inputs: Sequence[Any]) -> list[float]:
    """Microseconds of `call(x)` for each input but the first, which is the warm-up call."""
    call(inputs[0])  # warm-up (template compilation, caches)
    times = []
    for x in inputs[1:]:
        t0 = time.perf_counter()
        call(x)
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def inputs_for(warmth: str, history: Messages, repeats: int) -> list[tuple[Messages, Messages]]:
    """(previous, updated) per call, the warm-up first: fresh tool text each (cold) or one input (warm)."""
    if warmth == "warm":
        return [(history[:-1], history)] * (repeats + 1)
    out = []
    for _ in range(repeats + 1):
        fresh = with_line(history, fresh_line())
        out.append((fresh[:-1], fresh))
    return out


# -- verl's Continuous Token builder ---------------------------------------------------------------
def make_verl_builder(tokenizer: Any) -> tuple[Any | None, str]:
    """verl's builder exactly as AgentLoopBase.__init__ creates it (verl/experimental/agent_loop/
    agent_loop.py:248 -> verl/utils/tokenizer/continuous_token_wiring.py:218), or (None, why)."""
    try:
        import verl
        from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder
    except Exception as exc:  # verl pulls in ray, torch, hydra...; any failure means "skip this peer"
        return None, f"verl import failed: {type(exc).__name__}: {exc}"
    logging.getLogger("verl.utils.tokenizer.continuous_token_wiring").setLevel(logging.ERROR)
    # SmolLM2's config.json says model_type "llama": verl has no llama builder and falls back to the
    # default ContinuousTokenBuilder (a warning it logs, silenced above).
    builder = create_continuous_token_builder(tokenizer, hf_model_type="llama", chat_template_kwargs={})
    return builder, f"verl {getattr(verl, '__version__', '?')} {type(builder).__name__}"


def verl_ct_merge_context_msg(
    builder: Any, previous: Messages, updated: Messages, runtime_ids: list[int], response_mask: list[int]
) -> tuple[Any, list[int]]:
    """verl's method, as in verl/experimental/agent_loop/agent_loop.py:389 (AgentLoopBase.
    ct_merge_context_msg, called by ToolAgentLoop at tool_agent_loop.py:386) without the
    `run_in_executor` hop: `merge_context_tokens` then `align_response_metadata` (no logprobs)."""
    merge_result = builder.merge_context_tokens(previous, updated, runtime_ids, tools=None)
    mask, _ = builder.align_response_metadata(merge_result, response_mask, None)
    return merge_result, mask


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=TURNS, help="turns of the simulated episode")
    parser.add_argument(
        "--checkpoints", default=",".join(map(str, CHECKPOINTS)), help="turns k to time (those <= --turns)"
    )
    parser.add_argument(
        "--repeats", type=int, default=REPEATS_CHEAP, help="repeats of the per-append methods"
    )
    parser.add_argument(
        "--repeats-full", type=int, default=REPEATS_FULL, help="repeats of the full re-render"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    checkpoints = sorted({int(k) for k in args.checkpoints.split(",") if 0 < int(k) <= args.turns})
    if not checkpoints or args.repeats < 1 or args.repeats_full < 1:
        raise SystemExit("need a checkpoint within --turns and at least one repeat")
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    t_start = time.perf_counter()
    source = smollm2_source()
    tok = load_tokenizer(source)
    codec = ChatCodec(tok)
    builder, verl_info = make_verl_builder(tok)
    setup_s = time.perf_counter() - t_start

    first, turns = build_conversation(lambda text: len(codec.encode(text)), args.turns)
    eot = codec.eot_ids
    generated = [codec.encode(a["content"]) + eot for a, _ in turns]  # what the model "generated"
    context = {
        "tokenizer": source.name,
        "turns": args.turns,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }

    # -- one pass over the episode: running ids per method, per-turn snapshots, whole-episode cost --
    history: list[Messages] = []  # history[k-1]: messages after tool result k
    codec_ids = codec.prompt_ids(first)
    codec_total = 0.0
    full_total = 0.0
    verl_total = 0.0
    verl_ids = builder.build_initial_tokens(first) if builder else []
    verl_mask: list[int] = []
    verl_snapshots: dict[int, tuple[list[int], list[int]]] = {}
    messages = list(first)
    for k, ((assistant, tool), gen) in enumerate(zip(turns, generated, strict=True), start=1):
        codec_ids += gen
        messages.append(assistant)
        if builder:
            merged = builder.merge_assistant_tokens(verl_ids, gen)
            verl_mask, _ = builder.align_response_metadata(merged, verl_mask, None)
            verl_ids = merged.token_ids
            if k in checkpoints:
                verl_snapshots[k] = (verl_ids, verl_mask)
        previous = list(messages)
        messages.append(tool)
        history.append(list(messages))

        t0 = time.perf_counter()
        codec_ids += codec.continuation_ids([tool])
        codec_total += time.perf_counter() - t0
        t0 = time.perf_counter()
        codec.encode(codec.render(messages, add_generation_prompt=True))
        full_total += time.perf_counter() - t0
        if builder:
            t0 = time.perf_counter()
            merged, verl_mask = verl_ct_merge_context_msg(builder, previous, messages, verl_ids, verl_mask)
            verl_total += time.perf_counter() - t0
            verl_ids = merged.token_ids

    reference = codec.encode(codec.render(messages, add_generation_prompt=True))
    total_tokens = len(reference)

    # -- per-append cost at the checkpoints, cold and warm ----------------------------------------
    results: dict[str, dict[str, dict[int, float]]] = {w: {} for w in WARMTHS}
    for k in checkpoints:
        msgs = history[k - 1]
        at = {
            "k": k,
            "history_tokens": len(codec.encode(codec.render(msgs, add_generation_prompt=True))),
            "new_message_tokens": len(codec.encode(msgs[-1]["content"])),
            **context,
        }
        methods: dict[str, tuple[int, Callable[[tuple[Messages, Messages]], Any], dict[str, Any]]] = {
            "codec": (
                args.repeats,
                lambda pu: codec.continuation_ids([pu[1][-1]]),
                {"call": "ChatCodec.continuation_ids([tool_k])"},
            ),
            "full_rerender": (
                args.repeats_full,
                lambda pu: codec.encode(codec.render(pu[1], add_generation_prompt=True)),
                {"call": "codec.encode(codec.render(history_k, add_generation_prompt=True))"},
            ),
        }
        if builder:
            ids, mask = verl_snapshots[k]
            methods["verl"] = (
                args.repeats,
                lambda pu: builder.tokenize_context_incremental_messages(pu[0], pu[1], tools=None),
                {
                    "peer": verl_info,
                    "call": "ContinuousTokenBuilder.tokenize_context_incremental_messages(previous, updated)",
                },
            )
            methods["verl_merge"] = (
                args.repeats,
                lambda pu, i=ids, r=mask: verl_ct_merge_context_msg(builder, pu[0], pu[1], i, r),
                {
                    "peer": verl_info,
                    "call": "merge_context_tokens + align_response_metadata (agent_loop.py:389)",
                    "running_ids": len(ids),
                },
            )
        for warmth in WARMTHS:
            for method, (repeats, call, about) in methods.items():
                runs = spread(time_us(call, inputs_for(warmth, msgs, repeats)), 1)
                results[warmth].setdefault(method, {})[k] = runs["median"]
                rest = {key: v for key, v in runs.items() if key != "median"}
                emit(BENCH, "append_us", runs["median"], "us", method=method, warmth=warmth,
                     repeats=repeats, **rest, **about, **at)  # fmt: skip

    if not builder:
        emit(BENCH, "verl_skipped", None, None, reason=verl_info, **context)

    # -- whole episode, totals, ratios, exactness -------------------------------------------------
    emit(BENCH, "episode_ms", round(codec_total * 1e3, 2), "ms", method="codec", **context)
    emit(BENCH, "episode_ms", round(full_total * 1e3, 2), "ms", method="full_rerender", **context)
    if builder:
        emit(
            BENCH,
            "episode_ms",
            round(verl_total * 1e3, 2),
            "ms",
            method="verl_merge",
            peer=verl_info,
            **context,
        )
    emit(
        BENCH,
        "total_tokens",
        total_tokens,
        "tokens",
        k=args.turns,
        tool_tokens_mean=round(statistics.mean(len(codec.encode(t["content"])) for _, t in turns), 1),
        assistant_tokens_mean=round(statistics.mean(len(g) for g in generated), 1),
        **context,
    )

    last = checkpoints[-1]
    missed = []
    for warmth in WARMTHS:
        times = results[warmth]
        ratios = {f"{m}_vs_codec": times[m][last] / times["codec"][last] for m in times if m != "codec"}
        for name, value in ratios.items():
            goal = GOALS.get(name) if warmth == "cold" else None
            extra = {"goal": goal, "meets_goal": value >= goal} if goal is not None else {}
            if goal is not None and value < goal:
                missed.append(f"{name} ({warmth}) {value:.2f} < {goal}")
            emit(BENCH, name, round(value, 2), "x", warmth=warmth, k=last, **extra, **context)
    for method in results["cold"]:
        cold, warm = results["cold"][method][last], results["warm"][method][last]
        emit(BENCH, "cold_vs_warm", round(cold / warm, 2), "x", method=method, k=last, **context)

    mismatch = first_mismatch(codec_ids, reference)
    drift = codec.drift(messages, codec_ids)
    exact = mismatch is None and drift is None
    if not exact:
        missed.append("codec_exact")
    emit(
        BENCH,
        "codec_exact",
        exact,
        "bool",
        exact=exact,
        k=args.turns,
        running_tokens=len(codec_ids),
        reference_tokens=total_tokens,
        first_mismatch=mismatch,
        drift=drift,
        **context,
    )
    if builder:
        mismatch = first_mismatch(verl_ids, reference)
        note = None
        if mismatch is not None:
            ours, theirs = reference[mismatch : mismatch + 3], verl_ids[mismatch : mismatch + 3]
            note = (
                f"first tokens from the mismatch: full render {ours} {codec.decode(ours)!r}, "
                f"verl {theirs} {codec.decode(theirs)!r}; verl's default builder drops the template's "
                "'\\n' after the generated <|im_end|> at every turn boundary"
            )
        emit(
            BENCH,
            "verl_exact",
            mismatch is None,
            "bool",
            exact=mismatch is None,
            k=args.turns,
            peer=verl_info,
            running_tokens=len(verl_ids),
            reference_tokens=total_tokens,
            first_mismatch=mismatch,
            note=note,
            **context,
        )
    emit(BENCH, "goals_met", not missed, "bool", missed=missed, **context)
    emit(
        BENCH, "runtime_s", round(time.perf_counter() - t_start, 1), "s", setup_s=round(setup_s, 1), **context
    )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
