"""The `llama-server` command line, and a free loopback port for it.

Why its own module: both the server launcher (`llama_server.LlamaServer`) and the build cache's
smoke test (`llama_build.smoke`) start a llama-server, and the launcher asks the build cache which
binary it may trust. Keeping the command line here, below both, lets the launcher import the
build cache without the build cache importing the launcher back.
"""

from __future__ import annotations

import socket
from pathlib import Path

from uniagent.models.loading import smollm2_source


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def default_gguf() -> str:
    """The packaged SmolLM2 GGUF, the model a llama-server serves when none is named."""
    source = smollm2_source()
    return str(Path(source.path) / (source.gguf_file or ""))


def server_command(
    binary: str,
    gguf: str,
    *,
    host: str,
    port: int | None,
    slots: int,
    ctx_size: int,
    threads: int | None = None,
    extra_args: list[str] | None = None,
) -> list[str]:
    """The command line: `-c` is the whole KV cache, split evenly over the `-np` slots."""
    cmd = [
        binary,
        "--model", gguf,
        "--host", host,
        "--port", str(port),
        "--parallel", str(slots),
        "--ctx-size", str(ctx_size * slots),
        "--no-webui",
        "--no-warmup",
    ]  # fmt: skip
    if threads is not None:
        cmd += ["--threads", str(threads), "--threads-batch", str(threads)]
    return cmd + list(extra_args or [])
