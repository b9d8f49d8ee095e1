"""Prompts and sampling shared by the local engine's tests (test_local_engine, test_engine_memory)."""

from __future__ import annotations

from typing import Any

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


def tiny_llama(vocab_size: int, max_position_embeddings: int, **extra: Any) -> Any:
    """A 2-layer Llama (hidden 64, GQA 4/2), seeded: a model the trainer's tests can run on a CPU in
    seconds. `extra`: more `LlamaConfig` fields (e.g. `tie_word_embeddings`)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        **extra,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)
