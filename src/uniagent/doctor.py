"""`uniagent doctor`: what works on this machine, found by using it, with the reason when not.

Each part checks itself, and doctor finds the checks in the extension tables (each a
`uniagent.registry.Registry`), never in a list of its own: every line of a table that carries a
doctor check (each sandbox backend of `sandbox.registry.BACKENDS`, the runner backends of
`runner.config.RUN_BACKENDS`, the harness agents of `agent.registry.AGENTS`, the integrations of
`INTEGRATIONS` below) names an `async def
doctor_check() -> list[(name, ok, detail)]` beside its code, and each engine kind of the model
registry has its `KIND.doctor`; each starts the real thing (a sandbox that runs a command, a model that
generates a token, a daemon or an endpoint that answers). This module only finds those
functions and weighs their answers.

`ok` is True (works), False (broken) or None (not installed or not set up here). The default
path, the packaged local model and the `local` sandbox, plus every model named with
`--model`, is required: when one of those is broken doctor fails. Everything else is optional
and shows as a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from uniagent.errors import ConfigError
from uniagent.registry import Entry, Registry, resolve

if TYPE_CHECKING:
    from uniagent.models.config import ModelConfig
    from uniagent.models.registry import EngineKind

Row = tuple[str, bool | None, str]
DEFAULT_SANDBOX = "local"
# Optional parts that are no line of an extension table but have a check: one line each.
INTEGRATIONS = Registry(
    "integration",
    {
        "verl": Entry("uniagent.integrations.verl", "verl training", doctor="uniagent.integrations.verl"),
    },
)


def table_checks() -> list[tuple[str, str, bool]]:
    """(row name when the check cannot run, `"module:func"`, required) of every table line with a
    doctor check: sandbox backends (the default one required), integrations, harness agents."""
    from uniagent.agent.registry import AGENTS
    from uniagent.runner.config import RUN_BACKENDS
    from uniagent.sandbox.registry import BACKENDS

    out = [(f"sandbox {n}", ref, n == DEFAULT_SANDBOX) for n, ref in BACKENDS.doctor_checks()]
    out += [(n, ref, False) for n, ref in INTEGRATIONS.doctor_checks()]
    out += [(n, ref, False) for n, ref in RUN_BACKENDS.doctor_checks()]
    out += [(f"agent {n}", ref, False) for n, ref in AGENTS.doctor_checks()]
    return out


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
    """Every sandbox backend of the registry that `sandbox.create` builds from."""
    from uniagent.sandbox.registry import BACKENDS

    return list(BACKENDS)


def _model_specs(models: Sequence[str]) -> list[tuple[EngineKind, str, ModelConfig]]:
    """(engine kind, arg, config) per model to check; the packaged local model always. Any kind of
    the registry is accepted; a spec it does not know is a `ConfigError` listing the usages."""
    from uniagent.models.config import ModelConfig
    from uniagent.models.registry import engine_kind

    out = []
    for spec in ["local", *models]:
        kind, arg = engine_kind(spec)
        out.append((kind, arg, ModelConfig(spec=spec)))
    if any(kind.name == "local" for kind, _, _ in out[1:]):
        out.pop(0)  # a local model is named: it stands for the default one
    return out


async def _engine(kind: EngineKind, arg: str, config: ModelConfig, quick: bool) -> list[Check]:
    """One model's own check (its kind's `doctor`), required; a crashing check is a failure."""
    fallback = f"engine {config.spec}"
    if kind.doctor is None:
        return [Check(fallback, None, f"engine kind {kind.name!r} has no check", True)]
    try:
        rows: list[Row] = await kind.doctor(arg, config, quick)
    except Exception as exc:
        rows = [(fallback, False, f"the check itself failed: {type(exc).__name__}: {exc}"[:200])]
    return [Check(name, ok, detail, True) for name, ok, detail in rows]


async def _run(ref: str, fallback: str, required: bool) -> list[Check]:
    """One part's own check (`"module:func"`); a missing package is `None`, a crashing check is a
    failure."""
    try:
        check = resolve(ref)
    except ModuleNotFoundError as exc:
        return [Check(fallback, None, f"{exc.name} not installed", required)]
    try:
        rows: list[Row] = await check()
    except Exception as exc:
        rows = [(fallback, False, f"the check itself failed: {type(exc).__name__}: {exc}"[:200])]
    return [Check(name, ok, detail, required) for name, ok, detail in rows]


async def run_checks(models: Sequence[str] = (), quick: bool = False) -> list[Check]:
    """Run every check concurrently; `models` are extra model specs to check (and require);
    `quick` skips weight loads (local models: tokenizer and template only)."""
    from uniagent.models.registry import ENGINES, load_kind

    specs = _model_specs(models)
    jobs: list[Any] = [_engine(kind, arg, config, quick) for kind, arg, config in specs]
    jobs += [_run(ref, fallback, required) for fallback, ref, required in table_checks()]
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
    # Every other registered engine kind: one line saying how to check it.
    checked = {kind.name for kind, _, _ in specs}
    unchecked = []
    for name in ENGINES:
        if name in checked:
            continue
        try:
            usage = load_kind(name).usage
        except ConfigError as exc:
            unchecked.append(Check(f"engine {name}", None, str(exc)))
            continue
        unchecked.append(Check(f"engine {usage}", None, f"check one with --model {usage.split(' | ')[-1]}"))
    out[len(specs) : len(specs)] = [*unchecked, *await asyncio.to_thread(cpu_checks)]
    return out


def cpu_checks() -> list[Check]:
    """What was chosen by CPU feature, each found by running it here (`uniagent.cpu`): the CPU's
    matrix units, torch's kernel setting (probed in a child, fallen back from if it crashed), the
    attention kernels (decode per dtype, bf16 prefill), whether bf16 and fp32 linear layers run on packed
    weights (both timed in a child, per dtype), and the llama-server build variant (smoke-tested when
    built)."""
    from uniagent import cpu
    from uniagent.models.remote import llama_build

    units = " ".join(cpu.matrix_units()) or "none reported"
    rows = [Check("cpu", True, f"{cpu.model_name()}, {os.cpu_count()} cores; matrix units: {units}")]
    try:
        choice = cpu.torch_choice()
        rows.append(Check("torch kernels", True, choice.describe()))
    except RuntimeError as exc:
        rows.append(Check("torch kernels", False, str(exc)[:300], required=True))
    from uniagent.models import precision

    picked = precision.resolve("auto", "cpu")
    why = picked.why.removeprefix("auto: ")
    rows.append(Check("model.dtype auto", True, f"{picked.dtype} on cpu ({why})"))
    from uniagent.models import attention

    rows.append(Check("attention kernels", True, attention.choice().describe()))
    import torch

    from uniagent.models import linear

    rows.append(Check("bf16 linear", True, linear.choice(torch.bfloat16).describe()))
    rows.append(Check("fp32 linear", True, linear.choice(torch.float32).describe()))
    cuda = "yes" if torch.cuda.is_available() else "no"
    rows.append(Check("torch", True, f"{torch.__version__}, cuda={cuda}"))
    chosen = llama_build.choice()
    if not chosen:
        rows.append(Check("llama-server build", None, "not built here (`make llama-server`)"))
    else:
        fell = "; ".join(f"passed over {k}: {v}" for k, v in chosen.get("passed_over", {}).items())
        same = chosen.get("cpu") == cpu.cpu_id()
        detail = f"{chosen.get('variant')} ({chosen.get('about')}): {chosen.get('smoke')}" + (
            f"; {fell}" if fell else ""
        )
        if not same:
            detail += "; chosen on another CPU, re-tested at first use"
        rows.append(Check("llama-server build", True, detail))
    return rows
