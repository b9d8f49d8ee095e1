"""A local train config (`configs/train_*.yaml`) run on verl: `uniagent train --engine verl --config LOCAL`.

The config goes through `keys.KNOBS` into hydra overrides laid over a base recipe for its mode and
device (`BASE_RECIPE`: `trainer.mode: sync` -> main_ppo, `async` -> fully_async_main; `model.device:
cpu` -> the CPU recipes, verl's CPU plugin with a LocalEngine rollout, `cuda` -> the GPU ones, vLLM),
which contributes only what a local config cannot say (hardware, the rollout server, sequence
lengths, the agent-loop YAML). `--set`
items that name a `TrainConfig` field change the local config first (`trainer.steps=3`); every
other item is a hydra override for verl (`trainer.n_gpus_per_node=4`, `+uniagent.x=1`, `model@=...`)
and, given last, wins over the translation.
"""

from __future__ import annotations

import logging
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_origin

import yaml
from pydantic import BaseModel

from uniagent.errors import ConfigError
from uniagent.integrations.verl import keys
from uniagent.train.config import TrainConfig, build_train_config

log = logging.getLogger(__name__)

BASE_RECIPE = {
    ("sync", "cuda"): "multiturn_grpo",
    ("async", "cuda"): "multiturn_grpo_fully_async",
    ("sync", "cpu"): "multiturn_grpo_cpu",
    ("async", "cpu"): "multiturn_grpo_fully_async_cpu",
}
"""(trainer.mode, verl device) -> the recipe a local config's translation is laid over."""


def base_recipe(cfg: TrainConfig) -> str:
    """The base recipe for `cfg`'s mode and device, or a ConfigError naming what to change."""
    mode, device = cfg.trainer.mode, keys.verl_device(cfg)
    if (mode, device) not in BASE_RECIPE:
        have = ", ".join(f"{m} on {d}" for m, d in BASE_RECIPE)
        raise ConfigError(
            f"trainer.mode={mode} with model.device={cfg.model.device}: a local config runs on verl as {have}"
        )
    return BASE_RECIPE[mode, device]


SECTIONS = set(TrainConfig.model_fields)


def is_local_config(config: str | Path) -> bool:
    """A YAML file holding `TrainConfig` sections and no `overrides:` list (which makes a recipe)."""
    path = Path(config)
    if not (path.is_file() and path.suffix in (".yaml", ".yml")):
        return False
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and "overrides" not in data and bool(SECTIONS & set(data))


def names_local_field(item: str) -> bool:
    """Whether `KEY=VALUE` is for the local config: a `TrainConfig` field (a dict field, like `sandbox`,
    takes any key below it), or anything under a section verl's config lacks (`agent.max_turnz`
    then fails validation, naming the key), where `trainer.*` is both's: only its fields are local."""
    key, sep, _ = item.partition("=")
    if not sep or key.startswith(("+", "~")) or "@" in key:
        return False
    parts = key.split(".")
    if parts[0] in SECTIONS and parts[0] != "trainer":
        return True
    model: type[BaseModel] = TrainConfig
    for i, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            return False
        if i == len(parts) - 1:
            return True
        ann = info.annotation
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return get_origin(ann) is dict
        model = ann
    return True


@dataclass
class Translation:
    """A local config as verl sees it: entry point, base recipe, overrides, what verl cannot do."""

    cfg: TrainConfig
    entrypoint: str
    recipe: str
    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)  # verl key -> the local key it comes from
    dropped: list[str] = field(default_factory=list)

    @property
    def overrides(self) -> list[str]:
        return [override(key, value) for key, value in self.values.items()]


def translate(cfg: TrainConfig) -> Translation:
    """Every knob of `cfg` through `keys.KNOBS`; a key two knobs set differently is a bug, so it raises."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    dropped: list[str] = []
    for path, knob in keys.KNOBS.items():
        if knob.keys:
            for key, value in knob.values(cfg, path).items():
                if key in values and values[key] != value:
                    raise AssertionError(f"{path} sets {key}={value!r}, another knob set {values[key]!r}")
                values[key] = value
                below = key.removeprefix(knob.keys[0]) if key.startswith(knob.keys[0] + ".") else ""
                sources.setdefault(key, path + below)
        if knob.diverges is not None and knob.diverges(cfg):
            dropped.append(f"{path}={keys.local_value(cfg, path)!r}: {knob.why}")
    return Translation(cfg, keys.ENTRY_FOR_MODE[cfg.trainer.mode], base_recipe(cfg), values, sources, dropped)


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def hydra_value(value: Any) -> str:
    """`value` as hydra's override grammar reads it back (strings quoted unless plainly a name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in ("true", "false", "null", "inf", "nan"):
        return text
    if "'" in text or "\\" in text:
        raise ConfigError(f"value {text!r} cannot be passed to verl (quotes or backslashes)")
    return f"'{text}'"


def override(key: str, value: Any) -> str:
    """One hydra override; `uniagent.*` keys are added (`+`), verl's own keys exist already."""
    return f"{'+' if key.startswith(keys.LOOP) else ''}{key}={hydra_value(value)}"


def from_local_config(path: str | Path, items: list[str]) -> tuple[Translation, list[str]]:
    """The translation of the config at `path` with the local `--set` items applied, and the items
    left for verl (in their order, given after the translation so they win)."""
    local = [i for i in items if names_local_field(i)]
    rest = [i for i in items if not names_local_field(i)]
    translation = translate(build_train_config(Path(path), local))
    for line in translation.dropped:
        log.warning("not carried to verl: %s", line)
    data = Path(keys.data_dir(translation.cfg)) / "train.parquet"
    if not data.is_file():
        log.warning(
            "verl reads %s, not written yet: `%s` writes it (uniagent train --engine verl does so first)",
            data,
            shlex.join(prepare_command(translation.cfg)),
        )
    return translation, rest


def prepare_data(cfg: TrainConfig) -> dict[str, Any]:
    """Write the config's tasks as verl parquet where `keys.data_dir` says: every task trains (as
    locally), validation reads the same file."""
    from uniagent.integrations.verl.data import prepare

    return prepare(
        cfg.tasks.spec,
        keys.data_dir(cfg),
        val_size=0,
        seed=cfg.trainer.seed,
        family=cfg.tasks.family,
        limit=cfg.tasks.limit,
        ids=cfg.tasks.ids,
    )


def prepare_command(cfg: TrainConfig) -> list[str]:
    """The `uniagent data prepare` command `prepare_data` amounts to (printed with `--print`)."""
    command = ["uniagent", "data", "prepare", "--tasks", cfg.tasks.spec, "--output", keys.data_dir(cfg)]
    command += ["--val-size", "0", "--seed", str(cfg.trainer.seed)]
    if cfg.tasks.family:
        command += ["--family", cfg.tasks.family]
    if cfg.tasks.limit:
        command += ["--limit", str(cfg.tasks.limit)]
    for task_id in cfg.tasks.ids or []:
        command += ["--id", task_id]
    return command
