"""ChatCodec on SmolLM2's own template and twelve real templates, over 1-20 turn conversations."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import real_tokenizers as real
from conftest import SHARED_TEMPLATES, needs, require
from tokens_sim import TOOLS, conversation, load_templates, simulate, tokenizer_for
from uniagent.errors import TemplateError
from uniagent.tokens import ChatCodec, Trajectory
from uniagent.tokens.codec import _renders_content

TEMPLATES = load_templates(SHARED_TEMPLATES) if SHARED_TEMPLATES.is_dir() else {}
WHY = f"{SHARED_TEMPLATES} not present (set UNIAGENT_SHARED_DIR to the shared/ folder)"
needs_templates = needs("the shared chat templates", bool(TEMPLATES), WHY)

# Templates whose render of earlier turns changes once later turns exist; the codec must
# report drift for them, never hide it.
NOT_APPEND_ONLY = {"Qwen-Qwen3-0.6B", "openai-gpt-oss-120b", "mistralai-Mistral-Nemo-Instruct-2407"}
APPEND_ONLY = {
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen3-Coder",
    "HuggingFaceTB-SmolLM3-3B",
    "ibm-granite-granite-3.3-2B-Instruct",
    "deepseek-ai-DeepSeek-V3.1",
}


class _Codecs(dict):
    """SmolLM2 with each shared template, built up front; real (tokenizer, template) pairs
    (tests/real_tokenizers.py) built on first use, once per session."""

    def __missing__(self, name: str) -> ChatCodec:
        return real.codec(name)


@pytest.fixture(scope="module")
def codecs(smol_tokenizer):
    out = _Codecs(smollm2=ChatCodec(smol_tokenizer))
    for name, template in TEMPLATES.items():
        out[name] = ChatCodec(tokenizer_for(smol_tokenizer, template))
    return out


def _is_append_only(codec: ChatCodec, messages, tools) -> bool:
    """Independent oracle: each prompt the model saw, and each turn as it was generated, is a
    token prefix of the final render."""
    final = codec.encode(codec.render(messages, tools, add_generation_prompt=False))
    stops = set(codec.stop_token_ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        seen = codec.encode(codec.render(messages[:i], tools, add_generation_prompt=True))
        made = codec.encode(codec.render(messages[: i + 1], tools, add_generation_prompt=False))
        ends = [k + 1 for k, tok in enumerate(made) if tok in stops]
        made = made[: ends[-1]] if ends else made
        if final[: len(seen)] != seen or final[: len(made)] != made:
            return False
    return True


def _template_rejects(codec: ChatCodec, messages, tools) -> bool:
    """Independent oracle for a TemplateError: the full render fails or drops a message."""
    try:
        text = codec.render(messages, tools, add_generation_prompt=False)
    except TemplateError:
        return True
    return any(
        m.get("content", "").strip() and not _renders_content(m["content"].strip(), text) for m in messages
    )


SHAPES = [
    (n, role, tools, system)
    for n in (0, 1, 3, 19)
    for role in ("tool", "user", "ipython")
    for tools in (None, TOOLS)
    for system in (False, True)
]


@pytest.mark.parametrize("name", ["smollm2", *TEMPLATES, *real.PAIRS])
def test_codec_matches_full_render_or_reports_drift(codecs, name):
    codec = codecs[name]
    outcomes = {"exact": 0, "drift": 0, "rejected": 0}
    for n, role, tools, system in SHAPES:
        messages = conversation(n, role, system)
        try:
            traj, generations = simulate(codec, messages, tools)
        except TemplateError as exc:
            assert _template_rejects(codec, messages, tools), f"{name} {n} {role}: spurious {exc}"
            assert "template" in str(exc)
            outcomes["rejected"] += 1
            continue
        traj.validate()
        # Generated tokens are kept exactly, whatever the template does later.
        model_slices = [traj.response_ids[s.start : s.end] for s in traj.spans if s.kind == "model"]
        assert model_slices == generations
        final = codec.encode(codec.render(messages, tools, add_generation_prompt=False))
        if _is_append_only(codec, messages, tools):
            assert traj.drift is None, f"{name} n={n} role={role} tools={bool(tools)} sys={system}"
            assert traj.token_ids == final[: len(traj.token_ids)]
            outcomes["exact"] += 1
        else:
            assert traj.drift is not None
            assert traj.token_ids[: traj.drift] == final[: traj.drift]
            outcomes["drift"] += 1
    if name == "smollm2" or name in APPEND_ONLY:
        assert outcomes["drift"] == 0 and outcomes["exact"] > 0, outcomes
    if name in NOT_APPEND_ONLY:
        assert outcomes["drift"] > 0, outcomes


def test_smollm2_facts_come_from_the_template(codecs, smol_tokenizer):
    codec = codecs["smollm2"]
    assert smol_tokenizer.eos_token == "<|im_start|>"  # the tokenizer's own claim is wrong
    assert codec.facts.eot_text == "<|im_end|>"
    assert codec.stop_token_ids == smol_tokenizer.convert_tokens_to_ids(["<|im_end|>"])
    assert codec.decode(codec.boundary_ids) == "\n"
    assert codec.facts.generation_prompt == "<|im_start|>assistant\n"
    assert not codec.renders_tool_calls


def test_prompt_ids_equal_templates_own_tokenization(codecs, smol_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    own = smol_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    own = own["input_ids"] if hasattr(own, "keys") else own
    assert codecs["smollm2"].prompt_ids(messages) == list(own)


@pytest.mark.parametrize("name", real.PAIRS)
def test_real_prompt_ids_equal_templates_own_tokenization(codecs, name):
    """BOS and special tokens as the real tokenizer's own `apply_chat_template` puts them."""
    codec = codecs[name]
    for messages, tools in (
        ([{"role": "user", "content": "Hi there, ü 你好"}], None),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], TOOLS),
    ):
        try:
            own = codec.tokenizer.apply_chat_template(
                messages, tools=tools, chat_template=codec.chat_template, add_generation_prompt=True
            )
        except Exception:  # gemma's templates refuse a system turn: the codec must refuse too
            with pytest.raises(TemplateError):
                codec.prompt_ids(messages, tools)
            continue
        own = own["input_ids"] if hasattr(own, "keys") else own
        assert codec.prompt_ids(messages, tools) == list(own)
        bos = codec.tokenizer.bos_token_id
        if bos is not None and bos in own:
            assert codec.prompt_ids(messages, tools).count(bos) == 1  # never doubled


REAL_EOT = {
    "qwen3": ("<|im_end|>", "\n"),
    "llama3_1": ("<|eot_id|>", ""),
    "deepseek_v3": ("<｜end▁of▁sentence｜>", ""),
    "gemma3": ("<end_of_turn>", "\n"),
    "gptoss": ("<|end|>", ""),
}


@pytest.mark.parametrize("name", real.PAIRS)
def test_real_template_facts(codecs, name):
    """End-of-turn and boundary found by probing each real tokenizer with its template."""
    codec = codecs[name]
    eot, boundary = REAL_EOT[real.PAIRS[name][0]]
    assert codec.facts.eot_text == eot
    assert codec.eot_ids == codec.tokenizer.convert_tokens_to_ids([eot])
    assert codec.decode(codec.boundary_ids) == boundary
    if name.startswith("gptoss"):
        # the turn's own ends: <|return|> (final answer) and <|call|> (tool call); <|end|> also
        # closes the analysis message inside a turn, so it does not stop one
        assert codec.stop_token_ids == codec.tokenizer.convert_tokens_to_ids(["<|return|>", "<|call|>"])


@needs_templates
def test_template_facts(codecs):
    assert codecs["meta-llama-Llama-3.1-8B-Instruct"].facts.eot_text == "<|eot_id|>"
    assert codecs["meta-llama-Llama-3.1-8B-Instruct"].boundary_ids == []
    assert codecs["google-gemma-2-2b-it"].facts.eot_text == "<end_of_turn>"
    # Mistral has no generation prompt: generation starts right after [/INST].
    assert codecs["mistralai-Mistral-Nemo-Instruct-2407"].facts.generation_prompt == ""
    # Hermes-3 cannot render without tools; the probe found its facts with a probe tool list.
    assert codecs["NousResearch-Hermes-3-Llama-3.1-8B-tool_use"].facts.eot_text == "<|im_end|>"
    assert codecs["Qwen-Qwen2.5-7B-Instruct"].renders_tool_calls


@needs_templates
def test_unrenderable_shapes_raise_template_error(codecs):
    gemma = codecs["google-gemma-2-2b-it"]
    with pytest.raises(TemplateError, match="System role not supported"):
        gemma.prompt_ids([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])
    with pytest.raises(TemplateError, match="template"):
        gemma.continuation_ids([{"role": "tool", "content": "result"}])
    phi = codecs["microsoft-Phi-3.5-mini-instruct"]
    with pytest.raises(TemplateError, match="does not render 'tool' messages"):
        phi.continuation_ids([{"role": "tool", "content": "result"}])


def test_drift_reports_first_difference(codecs):
    codec = codecs["smollm2"]
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    ref = codec.encode(codec.render(messages, add_generation_prompt=False))
    running = ref[:-1]  # stops after <|im_end|>, before the trailing newline
    assert codec.drift(messages, running) is None
    changed = list(running)
    changed[5] = changed[5] + 1
    assert codec.drift(messages, changed) == 5
    assert codec.drift(messages, [*ref, 7]) == len(ref)
    assert codec.drift([*messages, {"role": "user", "content": "x"}], running) == len(running)


def test_codec_rejects_tokenizer_without_template(smol_tokenizer):
    import copy

    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        ChatCodec(tok)


def test_continuation_needs_messages(codecs):
    with pytest.raises(TemplateError):
        codecs["smollm2"].continuation_ids([])


TRICKY = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["", " ", "\n", "\n\n", "<|im_end|>", "<|im_start|>user", "<tool_call>", "\t x \r\n", "ü→🙂"]
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    contents=st.lists(TRICKY, min_size=3, max_size=9),
    name=st.sampled_from(
        ["smollm2", "Qwen-Qwen2.5-7B-Instruct", "Qwen3-Coder", "qwen3-Qwen2.5", "llama3_1-own"]
    ),
)
def test_property_contents_never_break_exactness(codecs, contents, name):
    require("the shared chat templates", name in codecs or name in real.PAIRS, WHY)
    codec = codecs[name]
    messages = [{"role": "user", "content": contents[0] or "start"}]
    for i, text in enumerate(contents[1:]):
        role = "assistant" if i % 2 == 0 else "tool"
        if role == "assistant":  # a model cannot emit its end-of-turn inside a turn
            text = text.replace(codec.facts.eot_text, "")
        messages.append({"role": role, "content": text})
    if messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": "end"})
    try:
        traj, generations = simulate(codec, messages)
    except TemplateError:
        assert _template_rejects(codec, messages, None)
        return
    traj.validate()
    assert [traj.response_ids[s.start : s.end] for s in traj.spans if s.kind == "model"] == generations
    if _is_append_only(codec, messages, None):
        assert traj.drift is None


def _char_split_first_generation(codec: ChatCodec, traj: Trajectory) -> Trajectory | None:
    """The trajectory with the longest word of its first generation sampled one character per
    token: the same text, a non-canonical split (what a model may sample)."""
    out = Trajectory(prompt_ids=list(traj.prompt_ids))
    split = False
    for s in traj.spans:
        ids = traj.response_ids[s.start : s.end]
        if s.kind == "model" and not split:
            stop = [t for t in ids[-1:] if t in codec.stop_token_ids]
            text = codec.decode(ids[: len(ids) - len(stop)])
            word = max(re.findall(r"[A-Za-z]{4,}", text), key=len)
            at = text.index(word)
            chars = [t for ch in word for t in codec.encode(ch)]
            ids = codec.encode(text[:at]) + chars + codec.encode(text[at + len(word) :]) + stop
            if codec.decode(ids) != codec.decode(traj.response_ids[s.start : s.end]):
                return None  # this tokenizer's decode does not round-trip (a template's added tokens)
            out.add_generation(ids, [-0.5] * len(ids))
            split = True
        elif s.kind == "model":
            out.add_generation(ids, traj.response_logprobs[s.start : s.end])
        else:
            out.add_context(ids, role=s.role)
    return out


@pytest.mark.parametrize("name", ["smollm2", *TEMPLATES, *real.PAIRS])
def test_drift_kinds_on_real_templates(codecs, name):
    """On every template: an exact episode has no drift; a non-canonical split of sampled text is
    `sampled` at the first difference; a template that is not append-only (its render of earlier
    turns changes) is never excused as `sampled`: it is `template`."""
    from uniagent.tokens.drift import drift_report

    codec = codecs[name]
    checked = {"exact": 0, "not_append_only": 0, "no_round_trip": 0}
    for n, role, tools, system in SHAPES:
        if n not in (1, 3):
            continue
        messages = conversation(n, role, system)
        try:
            traj, _ = simulate(codec, messages, tools)
        except TemplateError:
            continue
        report = drift_report(codec, messages, traj, tools)
        if traj.drift is not None:
            # `template` where a rendered prefix stops being a prefix of the next render; a
            # template that departs otherwise (it renders a lone history differently) stays
            # `bookkeeping`, the cautious side
            assert report.kind in ("template", "bookkeeping") and report.index is not None, (name, n, role)
            checked["not_append_only"] += 1
            continue
        assert tuple(report) == (None, None)
        split = _char_split_first_generation(codec, traj)
        if split is None:
            checked["no_round_trip"] += 1
            continue
        first = codec.drift(messages, split.token_ids, tools)
        assert first is not None, (name, n, role)
        assert tuple(drift_report(codec, messages, split, tools)) == (first, "sampled"), (name, n, role)
        checked["exact"] += 1
    assert sum(checked.values()) > 0, checked
    if name == "smollm2" or name in APPEND_ONLY - {"deepseek-ai-DeepSeek-V3.1"}:
        assert checked["exact"] > 0, checked
    if name in NOT_APPEND_ONLY:
        assert checked["not_append_only"] > 0, checked


def test_a_tool_result_the_template_writes_as_json_is_rendered_not_refused(codecs):
    """Llama 3.1's tool template writes a tool result `| tojson` ("a\\nb" with an escaped newline):
    the content is there, JSON-encoded, and the continuation is the full render's tokens."""
    codec = codecs["llama3_1-Llama-3.1"]
    messages = conversation(1, "tool")
    full = codec.encode(codec.render(messages[:2], TOOLS, add_generation_prompt=False))
    cont = codec.continuation_ids(messages[2:3], TOOLS)
    reference = codec.encode(codec.render(messages[:3], TOOLS, add_generation_prompt=True))
    assert '"file_0.py\\nREADME.md"' in codec.decode(cont)
    assert reference[len(full) :] == cont
