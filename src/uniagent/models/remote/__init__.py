"""Token-level engines over inference servers (vLLM, SGLang, llama.cpp's llama-server).

`base.RemoteEngine` owns what every server shares (replicas, sticky routing, health, safe retries,
abort, timeouts, errors); each server is one small `Dialect` module (`vllm`, `sglang`, `llamacpp`)
that defines `KIND` for the engine registry. Nothing heavy is imported here, so `models.config` can
import `remote.config` cheaply.
"""
