"""Cost per turn of an exact continuation for a stateful chat template, at about 35K tokens.

A stateful template renders a message differently after its real history (DeepSeek-V3 opens its
tool outputs once per conversation; gpt-oss names a tool result after the latest call), so the
codec renders the whole conversation for such a turn and appends what follows the ids it holds
(`ChatCodec.continuation_ids(new, tools, history=..., held_ids=...)`); append-only templates keep
the fast path (the new message rendered alone). On the real DeepSeek-V3 tokenizer with its own
template and the gpt-oss tokenizer with gpt-oss's template, an agent episode of tool calls and
250-300-token tool results (bench/codec_conversation.py) is run through `TokenConversation` up to
about `--tokens` tokens; then the next turn's continuation is timed, each repeat with a tool result
no memo holds (`cold`, what an episode pays), by method:

* ``stateful``  -- what the codec does for these templates (render all, encode with the piece memo,
                   compare the held ids);
* ``fast``      -- the append-only path (the tool result alone behind a probe turn): the floor, not
                   exact for these templates (gpt-oss cannot render a tool result alone: no figure);
* ``full_plain``-- render all and encode with the tokenizer's plain encode (no memo): what a
                   re-render per turn would cost without the codec.

It checks that the episode's running ids equal the template's full render token for token
(``exact``) and exits 1 when they do not. One JSON line per figure on stdout (bench/common.py):

    .venv/bin/python bench/codec_stateful.py                       # ~35K tokens, about a minute
    .venv/bin/python bench/codec_stateful.py --tokens 2000 --repeats 2   # smoke size, seconds
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from codec_conversation import build_conversation
from common import emit, spread
from uniagent.tokens import ChatCodec, TokenConversation
from uniagent.tokens.chunked import plain_encoder

BENCH = "codec_stateful"
ROOT = Path(__file__).resolve().parents[1]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command"}},
                "required": ["command"],
            },
        },
    }
]
# family -> (chat template file in the shared templates, or None for the tokenizer's own; how the
# assistant's tool call is written: DeepSeek-V3's template renders tool calls only without content)
CASES = {"deepseek_v3": (None, "content"), "gptoss": ("openai-gpt-oss-120b.jinja", "call")}
_fresh = itertools.count(1)


def tokenizers_dir() -> Path:
    return Path(os.environ.get("UNIAGENT_TOKENIZERS") or ROOT / ".cache" / "tokenizers")


def templates_dir() -> Path:
    if os.environ.get("UNIAGENT_SHARED_DIR"):
        return Path(os.environ["UNIAGENT_SHARED_DIR"]) / "chat_templates"
    for base in (ROOT.parent / "shared", ROOT / "shared", *(p / "shared" for p in ROOT.parents[1:])):
        if (base / "chat_templates").is_dir():
            return base / "chat_templates"
    return ROOT.parent / "shared" / "chat_templates"


def as_tool_turns(turns: list[list[dict[str, Any]]], style: str) -> list[list[dict[str, Any]]]:
    """bench/codec_conversation's text tool calls as `tool_calls` the template renders."""
    out = []
    for k, (assistant, tool) in enumerate(turns):
        thought, call = assistant["content"].split("\n<tool_call>\n", 1)
        function = json.loads(re.sub(r"\n</tool_call>$", "", call))
        tool_call = {"id": f"call{k:05d}", "type": "function", "function": function}
        content = thought if style == "content" else ""
        out.append(
            [
                {"role": "assistant", "content": content, "tool_calls": [tool_call]},
                {"role": "tool", "content": tool["content"], "tool_call_id": tool_call["id"]},
            ]
        )
    return out


def run_episode(codec: ChatCodec, messages: list[dict[str, Any]]) -> TokenConversation:
    """TokenConversation over `messages`, the 'model' emitting the template's own turn each time."""
    conv = TokenConversation(codec)
    stops = set(codec.stop_token_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        plan = conv.plan(messages[:i], TOOLS)
        full = codec.encode(codec.render(messages[: i + 1], TOOLS, add_generation_prompt=False))
        rest = full[len(plan.prompt_ids) :]
        gen = rest[: next(k for k, t in enumerate(rest) if t in stops) + 1]
        conv.add_reply(conv.commit(plan, gen, [0.0] * len(gen)), message)
    return conv


def time_us(call: Callable[[dict[str, Any]], Any], tool: dict[str, Any], repeats: int) -> list[float]:
    """Microseconds per call, each with the tool result plus a line no memo holds (cold)."""
    out = []
    for _ in range(repeats + 1):  # the first call warms code paths, not the memo
        fresh = {**tool, "content": tool["content"] + f"[done in {next(_fresh)} ms]\n"}
        t0 = time.perf_counter()
        call(fresh)
        out.append((time.perf_counter() - t0) * 1e6)
    return out[1:]


def bench_case(family: str, tokens: int, repeats: int) -> bool:
    from transformers import AutoTokenizer

    template_file, style = CASES[family]
    tok = AutoTokenizer.from_pretrained(tokenizers_dir() / family)
    template = (templates_dir() / template_file).read_text() if template_file else None
    codec = ChatCodec(tok, template)
    first = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix the test."}]
    turns = as_tool_turns(build_conversation(lambda t: len(codec.encode(t)), 2 + tokens // 300)[1], style)
    messages = list(first)
    for assistant, tool in turns[:-1]:
        messages += [assistant, tool]
        if len(codec.encode(codec.render(messages, TOOLS))) >= tokens:
            break
    conv = run_episode(codec, [*messages, turns[-1][0]])  # the next turn's call: generated
    held = conv.current.token_ids
    exact = held == codec.encode(codec.render([*messages, turns[-1][0]], TOOLS, add_generation_prompt=False))
    history = [*messages, turns[-1][0]]
    context = {"family": family, "template": template_file or "own", "kind": codec.kind.kind}
    context |= {"tokens": len(held), "turns": sum(m["role"] == "assistant" for m in history)}
    plain = plain_encoder(tok)
    methods: dict[str, Callable[[dict[str, Any]], Any]] = {
        "stateful": lambda t: codec.continuation_ids([t], TOOLS, history=history, held_ids=held),
        "full_plain": lambda t: plain(codec.render([*history, t], TOOLS)),
    }
    if family != "gptoss":
        methods["fast"] = lambda t: codec.continuation_ids([t], TOOLS)
    medians = {}
    for name, call in methods.items():
        runs = spread(time_us(call, turns[-1][1], repeats), 1)
        medians[name] = runs["median"]
        emit(BENCH, "append_us", runs["median"], "us", method=name, warmth="cold", **runs, **context)
    ratio = round(medians["full_plain"] / medians["stateful"], 2)
    emit(BENCH, "full_plain_vs_stateful", ratio, "x", **context)
    emit(BENCH, "exact", exact, None, **context)
    return exact


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=35_000, help="context size to time the turn at")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--families", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    args = parser.parse_args(argv)
    exact = [bench_case(f, args.tokens, args.repeats) for f in args.families.split(",")]
    return 0 if all(exact) else 1


if __name__ == "__main__":
    sys.exit(main())
