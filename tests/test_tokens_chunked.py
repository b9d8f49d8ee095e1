"""The memoising piecewise encoder (tokens/chunked.py) gives exactly the tokenizer's own ids."""

from __future__ import annotations

import random

import pytest

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


def test_random_text_around_special_tokens_encodes_exactly(tokenizer) -> None:
    chunked, plain = chunked_encoder(tokenizer), plain_encoder(tokenizer)
    assert chunked is not None  # SmolLM2: added tokens strip nothing
    rng = random.Random(0)
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_end", "im_start|>"]
    for _ in range(400):
        parts = [rng.choice(ALPHABET + specials) for _ in range(rng.randrange(1, 40))]
        text = "".join(parts)
        assert chunked(text) == plain(text), repr(text)
        assert chunked(text) == plain(text), repr(text)  # and again, from the memo


def test_a_rendered_episode_and_its_drift_check_match_the_plain_encode(tokenizer) -> None:
    codec = ChatCodec(tokenizer)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "You are a coding agent.\n\n  Be brief."},
        {"role": "user", "content": "Fix the bug in calc.py"},
        {"role": "assistant", "content": ' <tool_call>\n{"name": "bash"}\n</tool_call>'},
        {"role": "tool", "content": "  total 8\n\tcalc.py\n<|im_end|> literal in output\n\n"},
        {"role": "assistant", "content": "done"},
    ]
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
