"""`uniagent doctor`: what works on this machine, found by using it, with the reason when not.

Each backend checks itself: a sandbox module (`uniagent.sandbox.<type>`, one per type of the
sandbox config union), an engine module and each optional integration has an
`async def doctor_check(...) -> list[(name, ok, detail)]` beside its code, which starts the
real thing (a sandbox that runs a command, a model that generates a token, a daemon or an
endpoint that answers). This module only finds those functions and weighs their answers.

`ok` is True (works), False (broken) or None (not installed or not set up here). The default
path, the packaged local model and the `local` sandbox, plus every model named with
`--model`, is required: when one of those is broken doctor fails. Everything else is optional
and shows as a warning.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from uniagent.errors import ConfigError

Row = tuple[str, bool | None, str]
DEFAULT_SANDBOX = "local"
# Model spec kind -> the module holding that engine's check (the kinds `model.spec` accepts).
ENGINE_MODULES = {"local": "uniagent.models.local", "openai": "uniagent.models.openai_chat"}
OPTIONAL_MODULES = ("uniagent.integrations.verl", "uniagent.runner.ray_backend")


@dataclass
class Check:
    name: str
    ok: bool | None
    detail: str
    required: bool = False

    @property
    def status(self) -> Literal["ok", "FAIL", "warn", "n/a"]:
        if self.ok:
            return "ok"
        if self.ok is None:
            return "n/a"
        return "FAIL" if self.required else "warn"


def sandbox_types() -> list[str]:
    """Every sandbox backend, from the config union that `sandbox.create` accepts."""
    from uniagent.sandbox.config import DeployConfig

    union = typing.get_args(DeployConfig)[0]
    return [cls.model_fields["type"].default for cls in typing.get_args(union)]


def _model_specs(models: Sequence[str]) -> list[tuple[str, str, str]]:
    """(kind, arg, api-key variable) per model to check; the packaged local model always."""
    from uniagent.runner.config import ModelConfig
    from uniagent.runner.models import ModelFactory

    out = []
    for spec in models:
        cfg = ModelConfig(spec=spec)
        factory = ModelFactory(cfg)
        if factory.kind not in ENGINE_MODULES:
            raise ConfigError(f"doctor --model {spec!r}: give local, local:PATH or openai:URL")
        out.append((factory.kind, factory.arg, cfg.api_key_env))
    if not any(kind == "local" for kind, _, _ in out):
        out.insert(0, ("local", "", ""))
    return out


async def _run(module: str, args: tuple[Any, ...], fallback: str, required: bool) -> list[Check]:
    """One backend's own check; a missing package is `None`, a crashing check is a failure."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        return [Check(fallback, None, f"{exc.name} not installed", required)]
    try:
        rows: list[Row] = await mod.doctor_check(*args)
    except Exception as exc:
        rows = [(fallback, False, f"the check itself failed: {type(exc).__name__}: {exc}"[:200])]
    return [Check(name, ok, detail, required) for name, ok, detail in rows]


async def run_checks(models: Sequence[str] = (), quick: bool = False) -> list[Check]:
    """Run every check concurrently; `models` are extra model specs to check (and require);
    `quick` loads local models' tokenizers only."""
    jobs: list[Any] = []
    specs = _model_specs(models)
    for kind, arg, key_env in specs:
        args = (arg or None, not quick) if kind == "local" else (arg, key_env)
        jobs.append(_run(ENGINE_MODULES[kind], args, f"engine {kind}", required=True))
    for sandbox_type in sandbox_types():
        required = sandbox_type == DEFAULT_SANDBOX
        jobs.append(_run(f"uniagent.sandbox.{sandbox_type}", (), f"sandbox {sandbox_type}", required))
    jobs += [_run(module, (), module.rsplit(".", 1)[-1], required=False) for module in OPTIONAL_MODULES]
    # Backends log their own warnings (cgroups missing, host without isolation); here the
    # table says it once, so those lines would only be noise.
    logger = logging.getLogger("uniagent")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        results = await asyncio.gather(*jobs)
    finally:
        logger.setLevel(level)
    out = [check for rows in results for check in rows]
    if not any(kind == "openai" for kind, _, _ in specs):
        out.insert(len(specs), Check("engine openai:URL", None, "check an endpoint with --model openai:URL"))
    out.insert(len(specs), _torch())
    return out


def _torch() -> Check:
    import torch

    return Check("torch", True, f"{torch.__version__}, cuda={'yes' if torch.cuda.is_available() else 'no'}")
