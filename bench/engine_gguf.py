"""The packaged SmolLM2 GGUF re-written at full precision (F32 or BF16), so llama-server runs the same
precision class as LocalEngine.

Why: the packaged GGUF is 4-bit (Q4_1 matrices, a Q8_0 embedding). LocalEngine serves the weights
de-quantized from that very file (`uniagent.models.loading.smollm2_hf_dirs`), in fp32 or bf16; a
llama-server on the 4-bit file reads a quarter of the bytes per decode step and runs other kernels, so
"ours vs llama.cpp" would compare precisions, not engines. Here every quantized tensor is de-quantized
(`gguf.quants.dequantize`, the same values LocalEngine holds) and written as F32 or BF16, with the
metadata and tokenizer copied unchanged; 1-D tensors (norms) stay F32, as llama.cpp's own converter keeps
them. Cached under `uniagent.cpu.cache_root()/gguf/`, keyed by the source file's size and mtime.

    .venv/bin/python bench/engine_gguf.py bfloat16     # prints the path (seconds; cached after)
"""

from __future__ import annotations

import sys
from pathlib import Path

from uniagent import cpu
from uniagent.models.remote.llama_command import default_gguf

KINDS = {"float32": "F32", "bfloat16": "BF16"}
SKIP_KEYS = ("GGUF.", "general.architecture", "general.file_type")


def gguf_for(dtype: str, source: str | None = None) -> str:
    """The path of the packaged GGUF at `dtype` ("float32" | "bfloat16"), written on first use."""
    if dtype not in KINDS:
        raise SystemExit(f"no GGUF precision for dtype {dtype!r}; one of {sorted(KINDS)}")
    src = Path(source or default_gguf())
    stat = src.stat()
    out = cpu.cache_root() / "gguf" / f"{src.stem}-{stat.st_size}-{int(stat.st_mtime)}.{KINDS[dtype]}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{id(out)}")
        write_full_precision(src, tmp, dtype)
        tmp.replace(out)
    return str(out)


def write_full_precision(src: Path, dst: Path, dtype: str) -> None:
    """Copy `src`'s metadata and tensors to `dst`, every quantized tensor de-quantized to `dtype`."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    kind = gguf.GGMLQuantizationType[KINDS[dtype]]
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "float32" else gguf.LlamaFileType.MOSTLY_BF16)
    for key, field in reader.fields.items():
        if key.startswith(SKIP_KEYS):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        data = data.reshape([int(d) for d in reversed(tensor.shape.tolist())])
        if kind == gguf.GGMLQuantizationType.BF16 and data.ndim > 1:
            writer.add_tensor(tensor.name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    print(gguf_for(sys.argv[1] if len(sys.argv) > 1 else "float32"))
