"""Stateful and special templates on the real tokenizers: exact continuations, template kinds,
turn ends by content, refused roles, past reasoning and JSON-literal tool arguments."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

import real_tokenizers as real
from conftest import SHARED_TEMPLATES, require
from tokens_sim import TOOLS
from uniagent.errors import TemplateError
from uniagent.tokens import ChatCodec, TokenConversation, Trajectory
from uniagent.tokens.render import mapping_arguments, wants_mapping_arguments
from uniagent.tokens.template_kind import classify_template

GPT_OSS = "openai-gpt-oss-120b"


def tokenizer(family: str) -> Any:
    """The family's tokenizer as uniagent loads it (DeepSeek-V3's keeps its spaces), shared with
    the other real-tokenizer suites."""
    return real.tokenizer(family)


def template(name: str) -> str:
    path = SHARED_TEMPLATES / f"{name}.jinja"
    require("the shared chat templates", path.is_file(), f"{path} is missing")
    return path.read_text()


@functools.cache
def codec(family: str, name: str = "own", **kwargs: Any) -> ChatCodec:
    tok = tokenizer(family)
    return ChatCodec(tok, None if name == "own" else template(name), kwargs or None)


def tool_episode(n: int, arguments: str = "dict", content: str | None = "", final: bool = True) -> list[dict]:
    """system, user, n x (assistant calling a tool, tool result)[, final answer]."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix the failing test in repo/ please."},
    ]
    for i in range(n):
        args: Any = {"command": f"ls -la dir{i}"}
        call = {"id": f"call{i:05d}", "type": "function", "function": {"name": "bash", "arguments": args}}
        if arguments == "string":
            call["function"]["arguments"] = json.dumps(args)
        msgs.append({"role": "assistant", "content": content, "tool_calls": [call]})
        msgs.append({"role": "tool", "content": f"file_{i}.py\nREADME.md", "tool_call_id": call["id"]})
    if final:
        msgs.append({"role": "assistant", "content": "Done: the bug is fixed."})
    return msgs


def run_episode(c: ChatCodec, messages: list[dict], tools=None) -> tuple[TokenConversation, list[Trajectory]]:
    """The ReAct loop's bookkeeping, the 'model' emitting the template's own text for each turn
    (up to and including its first stop token) where the prompt is a prefix of the render."""
    conv = TokenConversation(c)
    stops = set(c.stop_token_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        plan = conv.plan(messages[:i], tools)
        full = c.encode(c.render(messages[: i + 1], tools, add_generation_prompt=False))
        if full[: len(plan.prompt_ids)] == plan.prompt_ids:
            rest = full[len(plan.prompt_ids) :]
            gen = rest[: next(k for k, t in enumerate(rest) if t in stops) + 1]
        else:  # a rewriting template shows this history differently: the model says its content
            assert c.kind.kind == "rewriting", f"prompt before message {i} is off-template"
            gen = c.encode(message["content"]) + c.eot_ids
        conv.add_reply(conv.commit(plan, gen, [-0.5] * len(gen)), message)
    return conv, conv.finish()


def own_render(c: ChatCodec, messages: list[dict], tools=None) -> list[int]:
    """The template's own tokenization (`apply_chat_template(tokenize=True)`), no codec involved;
    tool call arguments as mappings where the template `tojson`s them (a string would come out as a
    JSON string literal, which no model generates)."""
    if wants_mapping_arguments(c.tokenizer, c.chat_template, c.template_kwargs):
        messages = mapping_arguments(messages)
    out = c.tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=c.chat_template, tokenize=True, add_generation_prompt=False
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


# -- part 2: kinds and exact continuations ------------------------------------------------------
KINDS = [  # (family, template, kind, stateful): the table in docs/concepts/token-spine.md
    ("qwen3", "own", "rewriting", False),
    ("qwen3", "Qwen-Qwen3-0.6B", "rewriting", False),
    ("qwen3", "Qwen3-Coder", "append_only", False),
    ("qwen3", "Qwen-Qwen2.5-7B-Instruct", "append_only", False),
    ("llama3_1", "own", "append_only", False),
    ("llama3_1", "meta-llama-Llama-3.1-8B-Instruct", "append_only", False),
    ("deepseek_v3", "own", "stateful", True),
    ("deepseek_v3", "deepseek-ai-DeepSeek-V3.1", "append_only", False),
    ("gemma3", "own", "append_only", False),
    ("gemma3", "google-gemma-2-2b-it", "append_only", False),
    ("gptoss", GPT_OSS, "rewriting", True),
]


@pytest.mark.parametrize(("family", "name", "kind", "stateful"), KINDS)
def test_template_kinds_on_real_tokenizers(family, name, kind, stateful):
    c = codec(family, name)
    assert (c.kind.kind, c.facts.stateful) == (kind, stateful), c.kind.evidence
    assert c.kind.evidence
    direct = classify_template(c.tokenizer, c.chat_template)
    assert direct == c.kind


@pytest.mark.parametrize(
    ("family", "name", "content", "arguments"),
    [
        # its template renders tool calls only for content None, and then writes no end-of-turn
        # after a conversation's first call: its tool results are what is stateful here
        ("deepseek_v3", "own", "I will look around.", "string"),
        ("gptoss", GPT_OSS, "", "dict"),
        ("gptoss", GPT_OSS, "", "string"),
    ],
)
def test_stateful_episode_is_its_full_render(family, name, content, arguments):
    c = codec(family, name)
    assert c.facts.stateful
    messages = tool_episode(4, arguments, content)
    conv, (segment,) = run_episode(c, messages, TOOLS)
    assert segment.token_ids == own_render(c, messages, TOOLS)
    assert (segment.drift, segment.drift_kind) == (None, None)
    assert segment.reason == "start" and len(conv.segments) == 1


def test_deepseek_v3_renders_the_second_tool_result_after_the_first():
    """Why the history is needed: alone, a tool result opens the tool outputs again; after the
    history, DeepSeek-V3's template writes a newline and the output only."""
    c = codec("deepseek_v3")
    messages = tool_episode(2, "string", "I will look around.", final=False)
    opens = c.encode("<｜tool▁outputs▁begin｜>")
    alone = c.continuation_ids(messages[-1:], TOOLS)
    held = c.encode(c.render(messages[:-1], TOOLS, add_generation_prompt=False))
    exact = c.continuation_ids(messages[-1:], TOOLS, history=messages[:-1], held_ids=held)
    assert alone[: len(opens)] == opens and exact[: len(opens)] != opens
    assert held + exact == c.encode(c.render(messages, TOOLS))


def test_a_rewriting_template_still_drifts_or_splits():
    """gpt-oss drops the analysis of past tool calls once a final answer exists: exact while the
    episode runs, drift of kind `template` at the end; with follow_template, a new segment."""
    c = codec("gptoss", GPT_OSS)
    messages = tool_episode(2, content="I will look around.")
    _, (segment,) = run_episode(c, messages, TOOLS)
    assert segment.drift is not None and segment.drift_kind == "template"


# -- part 3: special template behaviours ---------------------------------------------------------
def test_gpt_oss_ends_a_turn_by_what_it_does():
    """gpt-oss: `<|call|>` after a tool call, `<|return|>` after a final answer; `<|end|>` closes
    the analysis message inside a turn (then the call follows), so it is no stop token."""
    c = codec("gptoss", GPT_OSS)
    call, ret, end = c.encode("<|call|>"), c.encode("<|return|>"), c.encode("<|end|>")
    assert c.stop_token_ids == [*ret, *call] and c.eot_ids == end
    for messages, ends in [
        (tool_episode(3, content="I will look around.", final=False), [*call * 3]),
        (tool_episode(2), [*call, *call, *ret]),
    ]:
        if messages[-1]["role"] == "tool":
            messages = messages[:-1]  # end on the model's turn
        _, (segment,) = run_episode(c, messages, TOOLS)
        ids, mask = segment.token_ids, [0] * len(segment.prompt_ids) + segment.response_mask
        last = [ids[k] for k in range(len(ids)) if mask[k] and (k + 1 == len(ids) or not mask[k + 1])]
        assert last == ends and ids == own_render(c, messages, TOOLS)
    # a tool-calling turn is one generation holding its analysis message and the `<|end|>` closing it
    assert "<|channel|>analysis<|message|>I will look around.<|end|><|start|>assistant to=" in c.decode(
        c.encode(c.render(tool_episode(1, content="I will look around.", final=False)[:3], TOOLS, False))
    )


def test_gemma3_refuses_tool_results_naming_its_rule():
    c = codec("gemma3")
    assert not c.renders_tool_role
    messages = tool_episode(1, final=False)[1:]  # Gemma 3 folds a system prompt into the user turn
    conv = TokenConversation(c)
    plan = conv.plan(messages[:1], TOOLS)
    gen = c.encode("I will look around.") + c.eot_ids
    conv.add_reply(conv.commit(plan, gen, [0.0] * len(gen)), messages[1])
    with pytest.raises(TemplateError, match=r"no tool role.*roles must alternate user/assistant"):
        conv.plan(messages, TOOLS)


def qwen3_thinking_episode(queries: int) -> list[dict]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."}]
    for q in range(queries):
        msgs.append({"role": "user", "content": f"Fix failing test number {q}."})
        for i, message in enumerate(tool_episode(2)[2:]):
            if message["role"] == "assistant":
                message = {**message, "reasoning_content": f"Query {q}, step {i}: the test imports a module."}
            msgs.append(message)
    return msgs


def test_qwen3_keeps_thinking_within_a_query_and_drops_it_after():
    """Qwen3's template keeps the reasoning of the turns since the last user message and drops
    earlier ones: an episode of one query is exact; a second query rewrites the first one's turns,
    reported as drift of kind `template` (or, with follow_template, a new segment)."""
    c = codec("qwen3")
    one = qwen3_thinking_episode(1)
    _, (segment,) = run_episode(c, one, TOOLS)
    assert segment.token_ids == own_render(c, one, TOOLS)[: len(segment.token_ids)]
    assert segment.drift is None and "<think>" in c.decode(segment.token_ids)
    two = qwen3_thinking_episode(2)
    _, (segment,) = run_episode(c, two, TOOLS)
    assert segment.drift_kind == "template"
    conv = TokenConversation(c, follow_template=True)
    for i, message in enumerate(two):
        if message["role"] == "assistant":
            plan = conv.plan(two[:i], TOOLS)
            full = c.encode(c.render(two[: i + 1], TOOLS, add_generation_prompt=False))
            rest = full[len(plan.prompt_ids) :]
            gen = rest[: rest.index(c.stop_token_ids[0]) + 1]
            conv.add_reply(conv.commit(plan, gen, [0.0] * len(gen)), message)
    assert [s.trajectory.reason for s in conv.segments] == ["start", "template"]
    assert all(t.drift is None for t in conv.finish())


@pytest.mark.parametrize("arguments", ["dict", "string"])
@pytest.mark.parametrize(("family", "name"), [("gptoss", GPT_OSS), ("qwen3", "Qwen-Qwen2.5-7B-Instruct")])
def test_tool_arguments_reach_the_template_as_a_mapping(family, name, arguments):
    """These templates write arguments `| tojson`: a mapping becomes the JSON object the model
    generated, the OpenAI-format string (arguments already serialised) would become a JSON string
    literal. The codec hands them a mapping either way, so the episode holds the model's bytes."""
    c = codec(family, name)
    messages = tool_episode(2, arguments)
    _, (segment,) = run_episode(c, messages, TOOLS)
    own = own_render(c, messages, TOOLS)
    assert segment.token_ids == own[: len(segment.token_ids)] and segment.drift is None
    literal = json.dumps({"command": "ls -la dir1"})
    text = c.decode(segment.token_ids)
    assert literal in text and json.dumps(literal) not in text


def test_string_arguments_stay_strings_where_the_template_writes_them_as_is():
    """DeepSeek-V3's own template writes the arguments string verbatim: no mapping for it."""
    c = codec("deepseek_v3")
    assert not wants_mapping_arguments(c.tokenizer, c.chat_template, c.template_kwargs)
    assert json.dumps({"command": "ls -la dir0"}) in c.render(tool_episode(1, "string", None), TOOLS, False)


def test_a_rollback_on_a_stateful_template_renders_its_history():
    """A request that rewrites the latest tool result rolls back to the last assistant turn; the
    new result is rendered after the real history, so the prompt is the template's own render."""
    c = codec("deepseek_v3")
    messages = tool_episode(3, "string", "I will look around.", final=False)
    conv, _ = run_episode(c, [*messages, {"role": "assistant", "content": "ok"}], TOOLS)
    rewritten = [*messages[:-1], {**messages[-1], "content": "permission denied"}]
    plan = conv.plan(rewritten, TOOLS)
    assert plan.reason == "rollback"
    assert plan.prompt_ids == c.encode(c.render(rewritten, TOOLS))


def test_append_only_templates_keep_the_fast_path(monkeypatch):
    """Only a stateful template renders the history for a continuation."""
    c = codec("llama3_1")
    assert not c.facts.stateful
    messages = tool_episode(3, final=False)
    conv, _ = run_episode(c, [*messages[:-1]], TOOLS)
    rendered: list[int] = []
    real = c.render
    monkeypatch.setattr(c, "render", lambda m, *a, **k: rendered.append(len(m)) or real(m, *a, **k))
    conv.plan(messages, TOOLS)
    assert rendered and max(rendered) <= len(c.facts.prefix) + 2


def test_a_keep_thinking_switch_reaches_the_template_through_template_kwargs():
    """A `preserve_thinking`-style switch (here added to Qwen3's own template, as newer Qwen
    templates have it) is set with `template_kwargs`: every render, probe included, gets it, so a
    second query no longer rewrites the first one's reasoning and the episode is exact."""
    own = tokenizer("qwen3").chat_template
    switch = "{%- if loop.index0 > ns.last_query_index %}"
    assert own.count(switch) == 1
    keeping = own.replace(switch, "{%- if preserve_thinking is true or loop.index0 > ns.last_query_index %}")
    two = qwen3_thinking_episode(2)
    c = ChatCodec(tokenizer("qwen3"), keeping, {"preserve_thinking": True})
    _, (segment,) = run_episode(c, two, TOOLS)
    assert segment.drift is None and c.decode(segment.token_ids).count("</think>") == 6
    c = ChatCodec(tokenizer("qwen3"), keeping)  # switch off: Qwen3's own behaviour
    _, (segment,) = run_episode(c, two, TOOLS)
    assert segment.drift_kind == "template"
