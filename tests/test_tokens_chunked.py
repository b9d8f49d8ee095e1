"""The memoising piecewise encoder (tokens/chunked.py) gives exactly the tokenizer's own ids."""

from __future__ import annotations

import random

import pytest

import real_tokenizers as real
from uniagent.tokens import ChatCodec
from uniagent.tokens.chunked import chunked_encoder, plain_encoder

ALPHABET = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "a",
    "b",
    "def",
    " x",
    "1",
    "é",
    "你好",
    "{",
    "}",
    '"',
    "<",
    "|",
    ">",
]


@pytest.fixture(scope="module")
def tokenizer():
    from uniagent.models.loading import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model(None))


# Real tokenizers whose added tokens are marked `normalized` (DeepSeek-V3's): the chunked encoder
# is not sure to be exact there, so the codec keeps the plain encode.
PLAIN_ONLY = {"deepseek_v3"}


@pytest.mark.parametrize("family", ["smollm2", *real.FAMILIES])
def test_random_text_around_special_tokens_encodes_exactly(tokenizer, family) -> None:
    tok = tokenizer if family == "smollm2" else real.tokenizer(family)
    chunked, plain = chunked_encoder(tok), plain_encoder(tok)
    if family in PLAIN_ONLY:
        assert chunked is None
        return
    assert chunked is not None  # added tokens strip nothing
    rng = random.Random(0)
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_end", "im_start|>"]
    if family != "smollm2":  # the family's own special tokens, whole and cut in half
        own = sorted(tok.all_special_tokens + list(tok.get_added_vocab())[:20])
        specials = own + [t[: len(t) // 2] for t in own[:5]] + [t[len(t) // 2 :] for t in own[:5]]
    for _ in range(400):
        parts = [rng.choice(ALPHABET + specials) for _ in range(rng.randrange(1, 40))]
        text = "".join(parts)
        assert chunked(text) == plain(text), repr(text)
        assert chunked(text) == plain(text), repr(text)  # and again, from the memo


@pytest.mark.parametrize("pair", ["smollm2", *real.PAIRS])
def test_a_rendered_episode_and_its_drift_check_match_the_plain_encode(tokenizer, pair) -> None:
    codec = ChatCodec(tokenizer) if pair == "smollm2" else real.codec(pair)
    tokenizer = codec.tokenizer
    tools = [
        {
            "type": "function",
            "function": {"name": "bash", "description": "Run bash.", "parameters": {"type": "object"}},
        }
    ]
    messages = [
        {"role": "system", "content": "You are a coding agent.\n\n  Be brief."},
        {"role": "user", "content": "Fix the bug in calc.py"},
        {
            "role": "assistant",
            "content": ' <tool_call>\n{"name": "bash"}\n</tool_call>',
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {}}}],
        },
        {"role": "tool", "content": "  total 8\n\tcalc.py\n<|im_end|> literal in output\n\n"},
        {"role": "assistant", "content": "done"},
    ]
    if pair.startswith("gemma3"):  # Gemma's templates refuse a system turn and the tool role
        messages = [
            {**m, "role": {"system": "user", "tool": "user"}.get(m["role"], m["role"])} for m in messages
        ]
        messages = [messages[0], *messages[2:]]
    text = codec.render(messages, tools)
    assert codec.encode(text) == plain_encoder(tokenizer)(text)


def test_the_pieces_are_memoised(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated render (the drift check at an episode's end, every sample of a group) costs no
    second tokenization of its pieces."""
    chunked = chunked_encoder(tokenizer)
    assert chunked is not None
    backend = tokenizer._tokenizer
    text = "<|im_start|>system\nA long system prompt with tools.<|im_end|>\n<|im_start|>user\nhi<|im_end|>"
    first = chunked(text)
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name):
            return getattr(backend, name)

        def encode(self, piece, **kw):
            calls.append(piece)
            return backend.encode(piece, **kw)

    monkeypatch.setattr(tokenizer, "_tokenizer", Counting())
    again = chunked_encoder(tokenizer)
    assert again is not None
    again(text)
    n = len(calls)
    assert again(text) == first and len(calls) == n


def test_a_tokenizer_whose_added_tokens_strip_spaces_keeps_the_plain_encode(tokenizer) -> None:
    class Token:
        content, lstrip, rstrip, single_word, normalized = "<x>", True, False, False, False

    class Backend:
        def get_added_tokens_decoder(self):
            return {0: Token()}

    class Fake:
        _tokenizer = Backend()

    assert chunked_encoder(Fake()) is None


@pytest.mark.parametrize("family", real.FAMILIES)
def test_a_real_tokenizer_is_loaded_as_its_tokenizer_json_defines_it(family) -> None:
    """transformers 5 rebuilds DeepSeek-V3's tokenizer (config: LlamaTokenizerFast) with a
    SentencePiece pre-tokenizer that drops spaces; uniagent's loader keeps the file's pipeline."""
    from tokenizers import Tokenizer

    text = "Step 1: look around.\n  ok ü 你好\tx"
    own = Tokenizer.from_file(str(real.folder(family) / "tokenizer.json"))
    tok = real.tokenizer(family)
    assert tok.encode(text, add_special_tokens=False) == own.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
