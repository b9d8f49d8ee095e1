"""Launch recipes: a YAML list of hydra overrides for one verl entry point, turned into a command.

A recipe (`recipes/verl/*.yaml`) names verl's entry point module and the overrides that make it
train with `UniAgentLoop`. Keeping recipes as plain override lists (not a config tree of our own)
means every key is one verl itself validates, and `uniagent train --engine verl` and a human typing
the printed command run exactly the same thing.

Placeholders in overrides: `{agent_loop}` is this package's agent-loop YAML, `{python}` the current
interpreter, `{smollm2_hf}` / `{smollm2_tokenizer}` the packaged SmolLM2 as Hugging Face directories
(what verl's FSDP actor can load; `models/loading.py:smollm2_hf_dirs`; `{smollm2_hf_with_tokenizer}`
one directory with both, as fully_async_main wants), and any key of the recipe's
`vars:` (e.g. `{data_dir}`, `{model}`). User overrides replace the recipe's override for the same key
(`a.b=1` replaces `a.b=0`, `+a.b` or `++a.b` alike), so a recipe is a starting point, never a cage;
`vars` are set with `VAR@=value`, e.g. `model@=Qwen/Qwen3-8B`.

A recipe may also name the environment its command needs (`env:`, e.g. the CPU recipes' verl plugin
and platform, `VERL_USE_EXTERNAL_MODULES` / `VERL_PLATFORM`): `launch` sets it on the child (Ray's
workers inherit it from there), the printed command carries it in front (`VAR=value python -m ...`),
and `{cpus}` in a value is this machine's core count. A module list (`VERL_USE_EXTERNAL_MODULES`)
is joined with what the caller's environment already lists (the recipe's first: a platform plugin
registers before anything else asks verl for the platform); any other variable is the recipe's.

Which trainer `main_ppo` runs (`check_trainer_path`): verl 0.9 defaults to its V1 trainer
(`trainer.use_v1=True`), where each agent-loop worker fires and forgets one task per prompt
(`AgentLoopWorkerTQ.generate_sequences`): a sample's exception only marks its prompt's group
`failure`, verl logs it and the sync replay buffer trains on the rest, padding what is missing.
`UniAgentLoop`'s step check (`uniagent.max_infra_failure_share`) works by raising, so there it
could never stop a step. The legacy trainer (`main_ppo_v0`, still shipped in 0.9.x, which our
`verl<0.10` pin holds) gathers each worker's samples in one `asyncio.gather` and `ray.get`s them in
`fit`, so the raise fails the step and the run; it is also the path the tests run, and it does not
need TransferQueue (V1 does, from verl's `verl-core` extra). So the `main_ppo` recipes set
`trainer.use_v1=False`, and a command that turns V1 back on while the check is on is refused.
The price: the legacy trainer takes one output per sample, so of an episode with several segments
(context condensed, history rewritten) only the last segment trains there; V1 takes one output per
segment and trains them all (see `loop.py`). `trainer.use_v1=True
+uniagent.max_infra_failure_share=1.0` chooses every segment over the step check.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import yaml

from uniagent.errors import ConfigError

AGENT_LOOP_YAML = Path(__file__).with_name("agent_loop.yaml")
RECIPES_DIR = Path(__file__).resolve().parents[4] / "recipes" / "verl"

USE_V1 = "trainer.use_v1"
ENTRYPOINTS = {
    "verl.trainer.main_ppo",
    "verl.experimental.fully_async_policy.fully_async_main",
}


def recipe_path(recipe: str | Path) -> Path:
    """A recipe file, or the name of one in `recipes/verl/` (with or without `.yaml`)."""
    path = Path(recipe)
    if path.is_file():
        return path
    for candidate in (RECIPES_DIR / f"{recipe}.yaml", RECIPES_DIR / str(recipe)):
        if candidate.is_file():
            return candidate
    known = ", ".join(available_recipes()) or "none found"
    raise ConfigError(f"no verl recipe {str(recipe)!r}; give a YAML file or one of: {known}")


def available_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")) if RECIPES_DIR.is_dir() else []


def load_recipe(recipe: str | Path) -> dict[str, Any]:
    path = recipe_path(recipe)
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or not isinstance(data.get("overrides"), list):
        raise ConfigError(f"{path}: a verl recipe is a mapping with an `overrides:` list")
    entry = data.get("entrypoint", "verl.trainer.main_ppo")
    if entry not in ENTRYPOINTS:
        raise ConfigError(f"{path}: entrypoint {entry!r} is not one of {', '.join(sorted(ENTRYPOINTS))}")
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise ConfigError(f"{path}: a recipe's `env:` is a mapping of variable names to values")
    data["entrypoint"] = entry
    data["env"] = {k: str(v) for k, v in env.items()}
    data["path"] = str(path)
    return data


_JOINED = frozenset({"VERL_USE_EXTERNAL_MODULES"})
"""Variables that hold a comma-separated module list: the recipe's modules are added to the caller's."""


def recipe_env(recipe: dict[str, Any], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables the recipe's command needs, as they will be set (see the module docstring)."""
    environ = dict(os.environ) if environ is None else environ
    out: dict[str, str] = {}
    for name, value in recipe.get("env", {}).items():
        value = value.replace("{cpus}", str(os.cpu_count() or 1))
        if name in _JOINED and environ.get(name):
            ours = [m for m in value.split(",") if m]
            value = ",".join([*ours, *(m for m in environ[name].split(",") if m and m not in ours)])
        out[name] = value
    return out


def override_key(override: str) -> str:
    """The config key an override sets (`+a.b=1`, `++a.b=1`, `~a.b` all set `a.b`)."""
    return override.split("=", 1)[0].lstrip("+~")


def _fill(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    return text


def resolve_overrides(recipe: dict[str, Any], overrides: list[str]) -> list[str]:
    """The recipe's overrides with placeholders filled and user overrides applied on top."""
    values = {str(k): str(v) for k, v in (recipe.get("vars") or {}).items()}
    user: list[str] = []
    for item in overrides:
        if "@=" in item and "=" not in item.split("@=", 1)[0]:
            name, value = item.split("@=", 1)
            values[name] = value
        else:
            user.append(item)
    values.setdefault("agent_loop", str(AGENT_LOOP_YAML))
    values.setdefault("python", sys.executable)
    named = " ".join([*map(str, recipe["overrides"]), *values.values()])
    if "{smollm2_" in named:
        from uniagent.models.loading import smollm2_hf_dir_with_tokenizer, smollm2_hf_dirs

        model_dir, tokenizer_dir = smollm2_hf_dirs()  # filled on first use (the GGUF reader: ~30 s)
        values.setdefault("smollm2_hf", str(model_dir))
        values.setdefault("smollm2_tokenizer", str(tokenizer_dir))
        if "{smollm2_hf_with_tokenizer}" in named:  # a directory of links, made only when named
            values.setdefault("smollm2_hf_with_tokenizer", str(smollm2_hf_dir_with_tokenizer()))
    merged: dict[str, str] = {}
    for item in [*(str(o) for o in recipe["overrides"]), *user]:
        merged.pop(override_key(item), None)  # later wins, and keeps its own position
        merged[override_key(item)] = _fill(item, values)
    return list(merged.values())


def build_command(recipe: str | Path, overrides: list[str]) -> list[str]:
    """The exact `python -m verl...` command for `recipe` plus `overrides`, its uniagent settings checked
    (agent-loop YAML entries with the `uniagent.*` overrides applied) before anyone runs it.
    `recipe` may also be a local train config (`local_config.py`): it is translated onto its mode's
    base recipe first."""
    return _plan(recipe, overrides)[0]


def shell_line(recipe: str | Path, overrides: list[str]) -> str:
    """The command as one shell line, the recipe's environment in front: what `uniagent verl command`
    and `uniagent train --engine verl --print` print, and what `launch` runs."""
    command, _, env = _plan(recipe, overrides)
    return shlex.join([*(f"{k}={v}" for k, v in env.items()), *command])


def _plan(recipe: str | Path, overrides: list[str]) -> tuple[list[str], Any, dict[str, str]]:
    """The command, the local config's `Translation` when `recipe` is one (else None), and the
    environment variables the recipe's command needs (`recipe_env`)."""
    from uniagent.integrations.verl import local_config
    from uniagent.integrations.verl.settings import check_overrides

    translation = None
    if local_config.is_local_config(recipe):
        translation, rest = local_config.from_local_config(recipe, list(overrides))
        recipe, overrides = translation.recipe, [*translation.overrides, *rest]
    data = load_recipe(recipe)
    if translation is not None and data["entrypoint"] != translation.entrypoint:
        raise ConfigError(f"{data['path']}: a base recipe for {translation.entrypoint} is needed")
    resolved = resolve_overrides(data, list(overrides))
    check_trainer_path(data["entrypoint"], resolved, check_overrides(resolved))
    return [sys.executable, "-m", data["entrypoint"], *resolved], translation, recipe_env(data)


def check_trainer_path(entrypoint: str, overrides: list[str], loops: dict[str, Any]) -> None:
    """Refuse verl's V1 trainer for `main_ppo` while a `UniAgentLoop` entry (`loops`: settings by
    entry name) has the infrastructure-failure check on: V1 would drop the failed group and train on
    (see the module docstring). `+uniagent.max_infra_failure_share=1.0` turns the check off."""
    if entrypoint != "verl.trainer.main_ppo":
        return
    value = None  # absent or deleted: verl's default, V1
    for item in overrides:
        if override_key(item) == USE_V1:
            value = None if item.startswith("~") else item.partition("=")[2].strip().lower()
    checked = {
        name: s.max_infra_failure_share for name, s in loops.items() if s.max_infra_failure_share < 1.0
    }
    if value == "false" or not checked:
        return
    share = min(checked.values())
    raise ConfigError(
        f"{USE_V1}={value or 'true (verl default)'}: verl's V1 trainer drops a prompt group whose sample "
        f"failed and trains on the rest, so uniagent.max_infra_failure_share={share:g} cannot stop a step; "
        f"keep {USE_V1}=False (the recipes' setting) or pass +uniagent.max_infra_failure_share=1.0 "
        "to train under V1 without the check"
    )


def launch(recipe: str | Path, overrides: list[str]) -> int:
    """Run the recipe's command in the foreground; its exit status is ours. A local train config's
    tasks are written as verl parquet first (`local_config.prepare_data`). When verl fails on a
    uniagent error, that error is repeated as the last line (`run_verl`)."""
    command, translation, env = _plan(recipe, overrides)
    if translation is not None:
        from uniagent.integrations.verl.local_config import prepare_data

        prepare_data(translation.cfg)
    return run_verl(command, {**os.environ, **env})


_UNIAGENT_ERROR = re.compile(r"uniagent\.errors\.(\w+): (.+)$")
_ANSI = re.compile(rb"\x1b\[[0-9;]*m")


def run_verl(command: list[str], env: dict[str, str]) -> int:
    """Run verl's `command`, its stderr passed through as it comes, and return its exit status. Why
    the pass-through: a uniagent error raised in a Ray worker (a dead rollout server, a step of
    infrastructure failures) reaches the user inside Ray's nested tracebacks, followed by hydra's and
    Ray's shutdown lines; the last `uniagent.errors.X: message` line of the last traceback is printed
    again, as `error: message`, after a failed run, so the run's last line says what stopped it (a
    traceback without one, e.g. a crash of verl's own, clears an earlier one logged by an episode)."""
    last: list[str] = []

    def scan(line: bytes) -> None:
        text = _ANSI.sub(b"", line).decode(errors="replace").rstrip()
        if "Traceback (most recent call last)" in text:
            last.clear()
        elif match := _UNIAGENT_ERROR.search(text):
            last[:] = [match.group(2)]

    def pump(stream: IO[bytes]) -> None:
        out = getattr(sys.stderr, "buffer", None)
        pending = b""
        while chunk := stream.read1(65536):  # raw chunks: tqdm's carriage returns stay as they are
            if out is not None:
                out.write(chunk)
                out.flush()
            else:
                sys.stderr.write(chunk.decode(errors="replace"))
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                scan(line)
        scan(pending)

    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE) as proc:
        assert proc.stderr is not None
        reader = threading.Thread(target=pump, args=(proc.stderr,), daemon=True)
        reader.start()
        try:
            code = proc.wait()
        except BaseException:  # Ctrl-C: the child got it too; do not leave it behind (subprocess.call)
            proc.kill()
            raise
        reader.join()
    if code and last:
        print(f"error: {last[0]}", file=sys.stderr, flush=True)
    return code
