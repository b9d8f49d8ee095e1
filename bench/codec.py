"""Cost of appending turn k of an agent conversation: ChatCodec vs full re-render vs verl.

A simulated 100-turn agent episode (about 30K tokens) on the real SmolLM2 tokenizer and chat
template: a system prompt and a task, then per turn an assistant message (~50 tokens: a short
thought and a tool call written as text) and a tool result (~250-300 tokens of realistic `ls`,
pytest, grep, git or `cat` output). The figure of interest is the cost of getting the token ids
to append after the model's turn k, i.e. for the tool result k plus the next generation prompt:

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

Each figure is the median of several repeats (``time.perf_counter``, after one warm-up call) at
turns k = 1, 10, 25, 50, 100. The script also times a whole 100-turn episode per method, prints
the ratios at turn 100 (``full_rerender_vs_codec``, goal >= 20; ``verl_vs_codec``, goal >= 1,
i.e. the codec is no slower) and checks that the codec's running ids (first prompt + simulated
generated assistant tokens ending in ``<|im_end|>`` + each continuation) equal the full render of
turn 100 token for token; verl's running ids get the same check, for information.

Output: one JSON object per line on stdout (keys ``bench``, ``figure``, ``value``, ``unit`` plus
context). Logs go to stderr. Runs in well under two minutes on 2 CPU cores, most of it loading
the tokenizer:

    .venv/bin/python bench/codec.py
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from uniagent.models.loading import load_tokenizer, smollm2_source
from uniagent.tokens import ChatCodec

BENCH = "codec_append"
TURNS = 100
CHECKPOINTS = (1, 10, 25, 50, 100)
REPEATS_CHEAP = 15  # per-append methods whose cost does not grow with the history
REPEATS_FULL = 7  # the full re-render, whose cost grows with the history
SEED = 1234
TOOL_TOKENS = (250, 300)
GOALS = {"full_rerender_vs_codec": 20.0, "verl_vs_codec": 1.0}

Messages = list[dict[str, Any]]


def emit(figure: str, value: Any, unit: str | None, **context: Any) -> None:
    print(json.dumps({"bench": BENCH, "figure": figure, "value": value, "unit": unit, **context}), flush=True)


def median_us(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up (template compilation, caches)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


# -- a realistic, deterministic conversation ------------------------------------------------------
FILES = [
    "src/uniagent/tokens/codec.py",
    "src/uniagent/tokens/probe.py",
    "src/uniagent/tokens/trajectory.py",
    "src/uniagent/models/loading.py",
    "src/uniagent/agent/loop.py",
    "src/uniagent/agent/tools.py",
    "src/uniagent/cli.py",
    "src/uniagent/errors.py",
    "tests/test_codec.py",
    "tests/test_trajectory.py",
    "tests/test_parsers.py",
    "tests/conftest.py",
    "pyproject.toml",
    "README.md",
    "Makefile",
]
WORDS = [
    "token",
    "template",
    "render",
    "encode",
    "decode",
    "probe",
    "boundary",
    "message",
    "assistant",
    "tool",
    "result",
    "drift",
    "mask",
    "prompt",
    "history",
    "turn",
    "cache",
    "tokenizer",
    "codec",
    "append",
    "sequence",
    "generation",
    "parser",
    "schema",
    "config",
]
PY_LINES = [
    "def continuation_ids(self, new_messages: Messages, tools: Tools = None) -> list[int]:",
    '    """Ids to append right after a generation that ended with the end-of-turn token."""',
    "    if not new_messages:",
    '        raise TemplateError("continuation needs at least one new message")',
    "    text = self.render(probe, tools, add_generation_prompt=True)",
    "    at = text.find(ASSISTANT_MARKER)",
    "    after = text[at + len(ASSISTANT_MARKER) :]",
    "    return self._after_eot_ids(after[len(eot) :])",
    "for i in range(n):",
    "    if reference[i] != token_ids[i]:",
    "        return i",
    "import json",
    "from typing import Any",
    "class Trajectory:",
    "    prompt_ids: list[int]",
    "    response_mask: list[int] = field(default_factory=list)",
]


def _ls_lines(rng: random.Random) -> list[str]:
    lines = [f"total {rng.randint(40, 400)}", "drwxr-xr-x  6 agent agent  4096 Nov 29 09:57 ."]
    for _ in range(60):
        name = rng.choice(FILES).split("/")[-1]
        mode = rng.choice(["-rw-r--r--", "-rwxr-xr-x", "drwxr-xr-x"])
        lines.append(
            f"{mode}  1 agent agent {rng.randint(120, 48000):6d} Nov {rng.randint(1, 29):2d} "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {name}"
        )
    return lines


def _pytest_lines(rng: random.Random) -> list[str]:
    test_file = rng.choice([f for f in FILES if f.startswith("tests/")])
    n = rng.randint(20, 90)
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
        "rootdir: /work/repo",
        "configfile: pyproject.toml",
        "plugins: asyncio-0.23.8, timeout-2.3.1, hypothesis-6.108.5",
        f"collected {n} items",
        "",
        f"{test_file} {''.join(rng.choice('....F.s') for _ in range(30))} [ {rng.randint(10, 99)}%]",
        "",
        "=================================== FAILURES ===================================",
        f"_____________________ test_{rng.choice(WORDS)}_{rng.choice(WORDS)} _____________________",
    ]
    for _ in range(40):
        roll = rng.random()
        if roll < 0.5:
            lines.append("    " + rng.choice(PY_LINES).strip())
        elif roll < 0.7:
            lines.append(f"E       AssertionError: assert {rng.randint(0, 50000)} == {rng.randint(0, 50000)}")
        elif roll < 0.85:
            lines.append(f"{test_file}:{rng.randint(10, 400)}: AssertionError")
        else:
            lines.append(f"FAILED {test_file}::test_{rng.choice(WORDS)} - TemplateError: {rng.choice(WORDS)}")
    return lines


def _grep_lines(rng: random.Random) -> list[str]:
    return [f"{rng.choice(FILES)}:{rng.randint(1, 400)}:{rng.choice(PY_LINES)}" for _ in range(60)]


def _git_lines(rng: random.Random) -> list[str]:
    lines = ["On branch main", "Changes not staged for commit:", '  (use "git add <file>..." to update)']
    lines += [f"\tmodified:   {rng.choice(FILES)}" for _ in range(4)]
    lines += ["", f"diff --git a/{FILES[0]} b/{FILES[0]}", "index 3f2a9c1..8be04d7 100644"]
    for _ in range(50):
        lines.append(rng.choice("+- ") + rng.choice(PY_LINES))
    return lines


def _cat_lines(rng: random.Random) -> list[str]:
    return [f"{i:4d}  {rng.choice(PY_LINES)}" for i in range(1, 80)]


OUTPUTS = [
    ("ls -la {d}", _ls_lines),
    ("python -m pytest -x -q {f}", _pytest_lines),
    ("grep -rn {w} src tests", _grep_lines),
    ("git status && git diff", _git_lines),
    ("cat -n {f}", _cat_lines),
]


def tool_output(
    rng: random.Random, make: Callable[[random.Random], list[str]], count: Callable[[str], int]
) -> str:
    """Whole lines of realistic output, between TOOL_TOKENS[0] and TOOL_TOKENS[1] tokens."""
    target = rng.randint(*TOOL_TOKENS)
    text = ""
    for line in make(rng):
        candidate = f"{text}{line}\n"
        if count(candidate) > TOOL_TOKENS[1]:
            break
        text = candidate
        if count(text) >= target:
            break
    return text


def build_conversation(count: Callable[[str], int]) -> tuple[Messages, list[Messages]]:
    """The first prompt and, per turn, [assistant message, tool message]."""
    rng = random.Random(SEED)
    system = (
        "You are a software engineering agent working in the repository /work/repo. You can run shell "
        'commands with the bash tool. To call it, write <tool_call>{"name": "bash", "arguments": '
        '{"command": "..."}}</tool_call> and wait for the result. Keep your reasoning short, make one '
        "change at a time and run the tests after every change. When the task is done, say DONE."
    )
    task = (
        "The test tests/test_codec.py::test_continuation_matches_render fails after the template update. "
        "Find the cause, fix it without changing the public API, and make the whole test suite pass."
    )
    first: Messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    turns = []
    thoughts = [
        "The output suggests the {w} handling in {f} is the cause; inspecting it.",
        "Not it yet; the {w} path in {f} still looks suspicious. Checking again.",
        "The edit to {f} applied. Rerunning the checks for the {w} issue.",
        "The traceback points at the {w} branch in {f}; reading the code around it.",
    ]
    for _ in range(TURNS):
        cmd_template, make = rng.choice(OUTPUTS)
        f = rng.choice(FILES)
        cmd = cmd_template.format(d=f.rsplit("/", 1)[0] if "/" in f else ".", f=f, w=rng.choice(WORDS))
        thought = rng.choice(thoughts).format(w=rng.choice(WORDS), f=f)
        call = json.dumps({"name": "bash", "arguments": {"command": cmd}})
        assistant = {"role": "assistant", "content": f"{thought}\n<tool_call>\n{call}\n</tool_call>"}
        tool = {"role": "tool", "content": tool_output(rng, make, count)}
        turns.append([assistant, tool])
    return first, turns


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


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    t_start = time.perf_counter()
    source = smollm2_source()
    tok = load_tokenizer(source)
    codec = ChatCodec(tok)
    builder, verl_info = make_verl_builder(tok)
    setup_s = time.perf_counter() - t_start

    first, turns = build_conversation(lambda text: len(codec.encode(text)))
    eot = codec.eot_ids
    generated = [codec.encode(a["content"]) + eot for a, _ in turns]  # what the model "generated"
    context = {
        "tokenizer": source.name,
        "turns": TURNS,
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
            if k in CHECKPOINTS:
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

    # -- per-append cost at the checkpoints --------------------------------------------------------
    results: dict[str, dict[int, float]] = {"codec": {}, "full_rerender": {}, "verl": {}, "verl_merge": {}}
    for k in CHECKPOINTS:
        msgs = history[k - 1]
        prev = msgs[:-1]
        tool = msgs[-1]
        n_tokens = len(codec.encode(codec.render(msgs, add_generation_prompt=True)))
        at = {
            "k": k,
            "history_tokens": n_tokens,
            "new_message_tokens": len(codec.encode(tool["content"])),
            **context,
        }

        results["codec"][k] = median_us(lambda t=tool: codec.continuation_ids([t]), REPEATS_CHEAP)
        emit(
            "append_us",
            round(results["codec"][k], 1),
            "us",
            method="codec",
            call="ChatCodec.continuation_ids([tool_k])",
            repeats=REPEATS_CHEAP,
            **at,
        )

        results["full_rerender"][k] = median_us(
            lambda m=msgs: codec.encode(codec.render(m, add_generation_prompt=True)), REPEATS_FULL
        )
        emit(
            "append_us",
            round(results["full_rerender"][k], 1),
            "us",
            method="full_rerender",
            call="codec.encode(codec.render(history_k, add_generation_prompt=True))",
            repeats=REPEATS_FULL,
            **at,
        )

        if builder:
            results["verl"][k] = median_us(
                lambda p=prev, m=msgs: builder.tokenize_context_incremental_messages(p, m, tools=None),
                REPEATS_CHEAP,
            )
            emit(
                "append_us",
                round(results["verl"][k], 1),
                "us",
                method="verl",
                peer=verl_info,
                call="ContinuousTokenBuilder.tokenize_context_incremental_messages(previous, updated)",
                repeats=REPEATS_CHEAP,
                **at,
            )
            ids, mask = verl_snapshots[k]
            results["verl_merge"][k] = median_us(
                lambda p=prev, m=msgs, i=ids, r=mask: verl_ct_merge_context_msg(builder, p, m, i, r),
                REPEATS_CHEAP,
            )
            emit(
                "append_us",
                round(results["verl_merge"][k], 1),
                "us",
                method="verl_merge",
                peer=verl_info,
                call="merge_context_tokens + align_response_metadata (agent_loop.py:389)",
                repeats=REPEATS_CHEAP,
                running_ids=len(ids),
                **at,
            )

    if not builder:
        emit("verl_skipped", None, None, reason=verl_info, **context)

    # -- whole episode, totals, ratios, exactness -------------------------------------------------
    emit("episode_ms", round(codec_total * 1e3, 2), "ms", method="codec", **context)
    emit("episode_ms", round(full_total * 1e3, 2), "ms", method="full_rerender", **context)
    if builder:
        emit("episode_ms", round(verl_total * 1e3, 2), "ms", method="verl_merge", peer=verl_info, **context)
    emit(
        "total_tokens",
        total_tokens,
        "tokens",
        k=TURNS,
        tool_tokens_mean=round(statistics.mean(len(codec.encode(t["content"])) for _, t in turns), 1),
        assistant_tokens_mean=round(statistics.mean(len(g) for g in generated), 1),
        **context,
    )

    last = CHECKPOINTS[-1]
    ratios = {"full_rerender_vs_codec": results["full_rerender"][last] / results["codec"][last]}
    if builder:
        ratios["verl_vs_codec"] = results["verl"][last] / results["codec"][last]
        ratios["verl_merge_vs_codec"] = results["verl_merge"][last] / results["codec"][last]
    for name, value in ratios.items():
        goal = GOALS.get(name)
        extra = {"goal": goal, "meets_goal": value >= goal} if goal is not None else {}
        emit(name, round(value, 2), "x", k=last, **extra, **context)

    mismatch = first_mismatch(codec_ids, reference)
    drift = codec.drift(messages, codec_ids)
    emit(
        "codec_exact",
        mismatch is None and drift is None,
        "bool",
        exact=mismatch is None and drift is None,
        k=TURNS,
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
            "verl_exact",
            mismatch is None,
            "bool",
            exact=mismatch is None,
            k=TURNS,
            peer=verl_info,
            running_tokens=len(verl_ids),
            reference_tokens=total_tokens,
            first_mismatch=mismatch,
            note=note,
            **context,
        )
    emit("runtime_s", round(time.perf_counter() - t_start, 1), "s", setup_s=round(setup_s, 1), **context)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
