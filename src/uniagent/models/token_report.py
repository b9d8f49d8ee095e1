"""What the codec will do with a tokenizer + chat template, before anyone trains on it.

`uniagent tokens check SPEC` prints this: the end-of-turn tokens the codec derives from the
template (never the tokenizer's `eos_token`, which is often wrong), how BOS is handled, whether
the template is append-only, stateful or rewriting (`uniagent.tokens.template_kind`, the
classification the codec itself runs), and so whether
the codec appends (fast path), re-renders or refuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from uniagent.errors import TemplateError
from uniagent.models.loading import load_tokenizer, resolve_model
from uniagent.tokens import ChatCodec


def token_report(spec: str | None, template_file: Path | None = None) -> dict[str, Any]:
    """The report for a model spec (`local`, a tokenizer folder, a model dir, a .gguf file)."""
    source = resolve_model(spec)
    tokenizer = load_tokenizer(source)
    template = template_file.read_text() if template_file else None
    try:
        codec = ChatCodec(tokenizer, chat_template=template)
    except TemplateError as exc:
        raise TemplateError(f"{exc}; give one with --template FILE") from exc
    facts = codec.facts
    kind = codec.kind

    def tokens(ids: list[int] | tuple[int, ...]) -> list[dict[str, Any]]:
        return [{"id": i, "text": codec.decode([i])} for i in ids]

    return {
        "tokenizer": source.path if not source.gguf_file else str(Path(source.path) / source.gguf_file),
        "tokenizer_class": type(tokenizer).__name__,
        "template": str(template_file) if template_file else "own",
        "end_of_turn": tokens(facts.eot_ids),
        "final_end_of_turn": tokens(facts.final_eot_ids),
        "stop_token_ids": codec.stop_token_ids,
        "eos_token": getattr(tokenizer, "eos_token", None),
        "boundary": facts.boundary_text,
        "generation_prompt": facts.generation_prompt,
        "bos": _bos(codec),
        "renders_tool_calls": codec.renders_tool_calls,
        "renders_tool_role": codec.renders_tool_role,
        "kind": kind.kind,
        "decided_on": kind.conversation,
        "at_message": kind.at_message,
        "reason": kind.evidence,
        "codec_action": kind.action,
        "reply_head": codec.reply_format.head,
        "reasoning_field": codec.reply_format.field or None,
    }


def _bos(codec: ChatCodec) -> str:
    """Who writes BOS: the codec encodes renders without adding special tokens, so a template
    that writes BOS gets exactly one and a template that does not gets none."""
    tokenizer = codec.tokenizer
    bos = getattr(tokenizer, "bos_token", None)
    if not bos:
        return "none: the tokenizer has no BOS token"
    prompt = codec.prompt_ids([{"role": "user", "content": "hi"}])
    bos_id = tokenizer.convert_tokens_to_ids(bos)
    count = prompt.count(bos_id)
    if count == 1 and prompt[0] == bos_id:
        return f"{bos} once, written by the template; the codec adds none"
    if count == 0:
        return f"{bos} not written by the template; the codec adds none (as apply_chat_template)"
    return f"{bos} {count} times in a one-message prompt: the template writes it more than once"
