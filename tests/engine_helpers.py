"""Prompts and sampling shared by the local engine's tests (test_local_engine, test_engine_memory)."""

from __future__ import annotations

from uniagent.models.base import SamplingParams

IM_END = 2  # SmolLM2's end of turn
QUESTIONS = [
    "Hi",
    "What is the capital of France? Answer in one word please.",
    "Write a haiku about the sea, the sky and the moon, with plenty of detail in every line.",
    "2+2=?",
    "Name three colours.",
    "Tell me a joke about computers that a child would understand.",
    "What is Python?",
    "Translate 'good morning' into French and Spanish, and say which is more formal.",
]


def chat_prompt(tokenizer, text: str, system: str | None = None) -> list[int]:
    messages = [{"role": "user", "content": text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def greedy(max_tokens: int = 24, stop: list[int] | None = None) -> SamplingParams:
    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, stop_token_ids=[IM_END] if stop is None else stop
    )
