"""Helpers for codec tests: real templates on the real SmolLM2 tokenizer, simulated episodes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from uniagent.tokens import ChatCodec, Trajectory

SPECIAL_RE = re.compile(r"<[|｜][^<>'\"\s]{1,40}?[|｜]>|\[/?[A-Z_]{3,20}\]|<(?:start|end)_of_turn>")

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


def tokenizer_for(base: Any, template: str) -> Any:
    """A copy of `base` with the template's marker strings added as special tokens."""
    tok = copy.deepcopy(base)
    specials = sorted(set(SPECIAL_RE.findall(template)))
    if specials:
        tok.add_special_tokens({"additional_special_tokens": specials}, replace_extra_special_tokens=False)
    tok.chat_template = template
    return tok


def load_templates(folder: Path) -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(folder.glob("*.jinja"))}


def conversation(n_turns: int, tool_role: str = "tool", with_system: bool = False) -> list[dict[str, Any]]:
    """user, then n_turns x (assistant with a tool call, tool result), final assistant answer."""
    msgs: list[dict[str, Any]] = []
    if with_system:
        msgs.append({"role": "system", "content": "You fix bugs."})
    msgs.append({"role": "user", "content": "Fix the failing test in repo/ please."})
    for i in range(n_turns):
        call_id = f"call{i:05d}"[:9].ljust(9, "x")
        msgs.append(
            {
                "role": "assistant",
                "content": f"Step {i}: look around.",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "bash", "arguments": {"command": f"ls -la dir{i}"}},
                    }
                ],
            }
        )
        msgs.append({"role": tool_role, "content": f"file_{i}.py\nREADME.md", "tool_call_id": call_id})
    msgs.append({"role": "assistant", "content": "Done: the bug is fixed."})
    return msgs


def simulate(
    codec: ChatCodec, messages: list[dict[str, Any]], tools=None
) -> tuple[Trajectory, list[list[int]]]:
    """Run an episode the way TokenChatModel does, with the 'model' emitting what the template would.

    Each generation is taken from a full render (so it is the canonical text), ends with the
    end-of-turn, and is stored as-is; context comes from `continuation_ids` (given the history
    and held ids, as TokenChatModel gives them). Returns the
    trajectory and each generation's ids.
    """
    first_assistant = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    traj = Trajectory(prompt_ids=codec.prompt_ids(messages[:first_assistant], tools))
    generations: list[list[int]] = []
    i = first_assistant
    while i < len(messages):
        assert messages[i]["role"] == "assistant"
        gen = generated_ids(codec, messages[: i + 1], traj.token_ids, tools)
        traj.add_generation(gen, [-0.5] * len(gen))
        generations.append(gen)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if i + 1 < j:
            # as TokenChatModel: the history and the held ids, for stateful templates' re-render
            after = codec.continuation_ids(
                messages[i + 1 : j], tools, history=messages[: i + 1], held_ids=traj.token_ids
            )
            traj.add_context(after, role=messages[i + 1]["role"])
        i = j
    traj.drift = codec.drift(messages, traj.token_ids, tools)
    return traj, generations


def generated_ids(codec: ChatCodec, upto: list[dict[str, Any]], running: list[int], tools) -> list[int]:
    """The tokens a model emits for the last message of `upto`: content then end-of-turn.

    Taken from the full render where the running sequence is a prefix of it (the canonical
    generation); otherwise (non-append-only templates) the assistant text tokenized alone.
    """
    stops = set(codec.stop_token_ids)
    full = codec.encode(codec.render(upto, tools, add_generation_prompt=False))
    if full[: len(running)] == running:
        rest = full[len(running) :]
        for k, tok in enumerate(rest):
            if tok in stops:
                return rest[: k + 1]
    return codec.encode(_assistant_text(codec, upto[-1])) + codec.eot_ids


def model_turn_ids(
    codec: ChatCodec, history: list[dict[str, Any]], message: dict[str, Any], running: list[int] | None = None
) -> list[int]:
    """The ids a model emits for the assistant `message` after `history`: what the template
    renders for that turn after its generation prompt, through its end-of-turn (Qwen3's own
    template: an empty think block first; gpt-oss: a channel header, then <|return|>, or <|call|>
    after a tool call), not just the content and end-of-turn. `running` is the sequence the model
    has seen (default: the prompt of `history`)."""
    running = codec.prompt_ids(history) if running is None else running
    upto = [*history, message]
    full_text = codec.render(upto, add_generation_prompt=False)
    prompt_text = codec.render(history)
    if codec.encode(full_text)[: len(running)] != running and full_text.startswith(prompt_text):
        # The template shows the held history otherwise (gpt-oss ends a past final answer with
        # <|end|>, not the <|return|> the model sampled): the turn's text after the prompt.
        rest = codec.encode(full_text[len(prompt_text) :])
        stop = next(k for k, tok in enumerate(rest) if tok in set(codec.stop_token_ids))
        return rest[: stop + 1]
    return generated_ids(codec, upto, running, None)


def _assistant_text(codec: ChatCodec, message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        content += "\n<tool_call>\n" + json.dumps(call["function"]) + "\n</tool_call>"
    return content
