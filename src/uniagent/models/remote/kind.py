"""From a spec (`vllm:URL[,URL...]`) to a `RemoteEngine`: what each dialect module's `KIND` is made of.

One helper, `remote_kind(DialectClass)`, so the vllm, sglang and llamacpp modules each register with
one line and share URL parsing, config mapping and the doctor check.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from uniagent.errors import ConfigError, EngineError, UniAgentError
from uniagent.models.base import SamplingParams
from uniagent.models.remote.base import Dialect, RemoteEngine
from uniagent.models.remote.config import RemoteConfig

if TYPE_CHECKING:
    from uniagent.models.config import ModelConfig
    from uniagent.models.registry import EngineKind, Row


def parse_urls(arg: str, kind: str) -> list[str]:
    """`URL[,URL...]` from a spec -> replica base URLs; a malformed list is a `ConfigError`."""
    urls = [u.strip().rstrip("/") for u in arg.split(",") if u.strip()]
    if not urls:
        raise ConfigError(f"model.spec {kind}: needs at least one server URL ({kind}:http://HOST:PORT[,...])")
    for url in urls:
        scheme, _, rest = url.partition("://")
        if scheme not in ("http", "https") or not rest:
            raise ConfigError(f"model.spec {kind}:{arg}: {url!r} is not an http:// or https:// URL")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"model.spec {kind}:{arg}: a replica URL is listed twice")
    return urls


def engine_options(config: ModelConfig) -> dict[str, Any]:
    """The keyword arguments every remote engine takes from a model config (`model.remote`,
    `model.timeout_s`, `model.max_retries`)."""
    return {
        "config": getattr(config, "remote", None) or RemoteConfig(),
        "timeout_s": config.timeout_s,
        "retries": config.max_retries,
    }


def build_engine(dialect_cls: type[Dialect], arg: str, config: ModelConfig) -> RemoteEngine:
    """Spec URLs + model config -> `RemoteEngine`."""
    return RemoteEngine(
        parse_urls(arg, dialect_cls.name), dialect_cls.from_config(config), **engine_options(config)
    )


async def doctor_rows(dialect_cls: type[Dialect], arg: str, config: ModelConfig, quick: bool) -> list[Row]:
    """`uniagent doctor --model KIND:URL,...`: each replica's health check; unless quick, one 1-token
    generation from a chat prompt in the configured tokenizer (the server must speak those ids)."""
    name = f"engine {dialect_cls.name}"
    try:
        engine = build_engine(dialect_cls, arg, config)
    except UniAgentError as exc:
        return [(name, False, str(exc))]
    rows: list[Row] = []
    try:
        for url, ok, why in await engine.health():
            rows.append((f"{name} {url}", ok, why if not ok else f"{dialect_cls.health_path} answers"))
        if quick or not any(ok for _, ok, _ in rows):
            return rows
        rows.append(await _generate_row(engine, config, name))
    finally:
        await engine.aclose()
    return rows


async def _generate_row(engine: RemoteEngine, config: ModelConfig, name: str) -> Row:
    from uniagent.models.loading import load_tokenizer, resolve_model
    from uniagent.tokens import ChatCodec

    try:
        codec = ChatCodec(await asyncio.to_thread(load_tokenizer, resolve_model(config.tokenizer)))
        prompt = codec.prompt_ids([{"role": "user", "content": "Say hi."}])
        began = time.perf_counter()
        gen = await engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1), "doctor")
    except (EngineError, UniAgentError) as exc:
        return (f"{name} generate", False, str(exc)[:300])
    took = (time.perf_counter() - began) * 1000
    return (
        f"{name} generate",
        True,
        f"1 token from a {len(prompt)}-token prompt in {took:.0f} ms, logprob {gen.logprobs[0]:.3f} "
        f"({engine.logprobs} logprobs)",
    )


def remote_kind(dialect_cls: type[Dialect]) -> EngineKind:
    """The registry entry of a token server: `NAME:URL[,URL...]`, token level, its doctor check."""
    from uniagent.models.registry import EngineKind

    async def build(arg: str, config: ModelConfig) -> RemoteEngine:
        return build_engine(dialect_cls, arg, config)

    async def doctor(arg: str, config: ModelConfig, quick: bool) -> list[Row]:
        return await doctor_rows(dialect_cls, arg, config, quick)

    return EngineKind(
        name=dialect_cls.name,
        usage=f"{dialect_cls.name}:URL[,URL...]",
        token_level=True,
        build=build,
        doctor=doctor,
    )
