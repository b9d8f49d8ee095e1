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
registers before anything else asks verl for the platform, then `plugin.py`, which every command
gets: it adds uniagent's step metrics to verl's); any other variable is the recipe's.

Where a run's files go (`metrics_file`): checkpoints in `trainer.default_local_dir` (a local
config's `trainer.output/checkpoints`), and, when `trainer.logger` has verl's `file` logger, its
metrics rows in `metrics.jsonl` beside them (`VERL_FILE_LOGGER_PATH`, set on the command), the file
`uniagent dashboard --train DIR` reads. While the run goes, `launch` follows that file and prints one
progress line per step (`progress.py`), readable in a CI log.

Which trainer `main_ppo` runs (`check_trainer_path`): verl 0.9 defaults to its V1 trainer
(`trainer.use_v1=True`), where each agent-loop worker fires and forgets one task per prompt
(`AgentLoopWorkerTQ.generate_sequences`, verl 0.9.1 `trainer/ppo/v1/agent_loop_tq.py:100-105`): a
sample's exception only tags its prompt's group `failure` (`:133-143`), verl logs it and the sync
replay buffer trains on the rest, padding what is missing. `UniAgentLoop`'s raise could never stop a
step there, so under V1 the check (`uniagent.max_infra_failure_share`) is uniagent's replay buffer
(`sampler.py`, named by `settings.V1_SAMPLER_OVERRIDES`), which checks the step's whole batch before
verl trains on it; a V1 command with the check on must name it, keep V1's sync mode and leave
`algorithm.filter_groups` off (verl gives a custom replay buffer no group filter), or it is refused.
The legacy trainer (`main_ppo_v0`, still shipped in 0.9.x, which our `verl<0.10` pin holds) gathers
each worker's samples in one `asyncio.gather` and `ray.get`s them in `fit`, so the loop's raise fails
the step there; the GPU `main_ppo` recipes set `trainer.use_v1=False`, `multiturn_grpo_v1_cpu` runs
V1. The legacy trainer takes one output per sample, so of an episode with several segments (context
condensed, history rewritten) only the last segment trains there; V1 takes one output per segment and
trains them all (see `loop.py`). `+uniagent.max_infra_failure_share=1.0` turns the check off anywhere.

A recipe may extend another (`base: NAME`): the base's overrides come first and the recipe's own
replace them key by key, as user overrides do; `env:` and `vars:` merge, the recipe's winning; the
entry point is the base's (`_extend`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import yaml

from uniagent.errors import ConfigError
from uniagent.integrations.verl.overrides import override_key, override_value

AGENT_LOOP_YAML = Path(__file__).with_name("agent_loop.yaml")
RECIPES_DIR = Path(__file__).resolve().parents[4] / "recipes" / "verl"

USE_V1 = "trainer.use_v1"
PLUGIN = "uniagent.integrations.verl.plugin"
"""verl plugin module every command loads (`plugin.py`: uniagent's step metrics)."""
METRICS_ENV = "VERL_FILE_LOGGER_PATH"
HYDRA_PRINTS = frozenset({"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help"})
"""hydra's flags that print (the config, help) instead of running the job."""
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


def load_recipe(recipe: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The recipe as a mapping, laid over its `base:` recipe when it names one (see `_extend`)."""
    path = recipe_path(recipe)
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: recipes extend each other in a cycle")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or not isinstance(data.get("overrides"), list):
        raise ConfigError(f"{path}: a verl recipe is a mapping with an `overrides:` list")
    if data.get("base"):
        data = _extend(load_recipe(str(data["base"]), (*_seen, path.resolve())), data, path)
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


def _extend(base: dict[str, Any], data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A recipe with `base: OTHER` is OTHER's overrides followed by its own (a key it sets wins, in
    its position, as a user override does), OTHER's `env:` and `vars:` updated by its own, and
    OTHER's entry point, which it may only repeat. What describes one file (description, the local
    config it is a twin of) is not inherited."""
    entry = data.get("entrypoint", base["entrypoint"])
    if entry != base["entrypoint"]:
        raise ConfigError(f"{path}: entrypoint {entry!r} differs from its base's {base['entrypoint']!r}")
    return {
        "description": data.get("description", ""),
        **{k: v for k, v in data.items() if k not in ("overrides", "env", "vars", "base")},
        "entrypoint": entry,
        "env": {**base["env"], **(data.get("env") or {})},
        "vars": {**(base.get("vars") or {}), **(data.get("vars") or {})},
        "overrides": [*base["overrides"], *data["overrides"]],
        "base": base["path"],
    }


_JOINED = frozenset({"VERL_USE_EXTERNAL_MODULES"})
"""Variables that hold a comma-separated module list: the recipe's modules are added to the caller's."""


def recipe_env(recipe: dict[str, Any], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables the recipe's command needs, as they will be set (see the module docstring)."""
    environ = dict(os.environ) if environ is None else environ
    out: dict[str, str] = {}
    wanted = dict(recipe.get("env", {}))
    modules = [m for m in wanted.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    wanted["VERL_USE_EXTERNAL_MODULES"] = ",".join([*modules, *([PLUGIN] if PLUGIN not in modules else [])])
    for name, value in wanted.items():
        value = value.replace("{cpus}", str(os.cpu_count() or 1))
        if name in _JOINED and environ.get(name):
            ours = [m for m in value.split(",") if m]
            value = ",".join([*ours, *(m for m in environ[name].split(",") if m and m not in ours)])
        out[name] = value
    return out


def metrics_file(overrides: list[str]) -> Path | None:
    """Where verl's file logger writes the run's metrics rows: `metrics.jsonl` in the run's output
    directory, the one holding `trainer.default_local_dir` when that is named `checkpoints` (a
    local config's `trainer.output/checkpoints`), else that directory itself. None when
    `trainer.logger` has no `file` logger or the checkpoint directory is verl's interpolated
    default."""
    from uniagent.train.outputs import METRICS

    sinks = (override_value(overrides, "trainer.logger") or "").strip("[]")
    ckpt = override_value(overrides, "trainer.default_local_dir")
    if "file" not in [s.strip().strip("'\"") for s in sinks.split(",")] or not ckpt or "${" in ckpt:
        return None
    folder = Path(ckpt).expanduser()
    return (folder.parent if folder.name == "checkpoints" else folder).resolve() / METRICS


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
    env = recipe_env(data)
    metrics = metrics_file(resolved)
    if metrics is not None:
        env[METRICS_ENV] = str(metrics)
    return [sys.executable, "-m", data["entrypoint"], *resolved], translation, env


def check_trainer_path(entrypoint: str, overrides: list[str], loops: dict[str, Any]) -> None:
    """Under verl's V1 trainer for `main_ppo`, while a `UniAgentLoop` entry (`loops`: settings by entry
    name) has the infrastructure-failure check on, require what makes the check work there: uniagent's
    replay buffer (`settings.V1_SAMPLER_OVERRIDES`, see `sampler.py`), verl's sync trainer mode, and no
    `algorithm.filter_groups` (which a custom sampler does not get). `+uniagent.max_infra_failure_share=1.0`
    turns the check off; the legacy trainer (`trainer.use_v1=False`) needs nothing."""
    from uniagent.integrations.verl.settings import V1_SAMPLER, V1_SAMPLER_OVERRIDES

    if entrypoint != "verl.trainer.main_ppo":
        return
    given: dict[str, str | None] = {}
    for item in overrides:
        given[override_key(item)] = None if item.startswith("~") else item.partition("=")[2].strip()
    use_v1 = (given.get(USE_V1) or "true (verl default)").lower()
    checked = {
        name: s.max_infra_failure_share for name, s in loops.items() if s.max_infra_failure_share < 1.0
    }
    if use_v1 == "false" or not checked:
        return
    setting = f"uniagent.max_infra_failure_share={min(checked.values()):g}"
    off = "or pass +uniagent.max_infra_failure_share=1.0 to train without the check"
    if any(given.get(key) != value for key, value in V1_SAMPLER.items()):
        raise ConfigError(
            f"{USE_V1}={use_v1}: verl's V1 trainer logs a failed sample and trains on the rest of its group "
            f"(verl 0.9.1 trainer/ppo/v1/agent_loop_tq.py:133-143), so {setting} needs uniagent's "
            f"replay buffer to stop the step: add {shlex.join(V1_SAMPLER_OVERRIDES)} "
            f"(recipe multiturn_grpo_v1_cpu has them), keep {USE_V1}=False, {off}"
        )
    mode = given.get("trainer.v1.trainer_mode") or "sync"
    if mode != "sync":
        raise ConfigError(
            f"trainer.v1.trainer_mode={mode}: {setting} is checked under V1's sync mode only; {off}"
        )
    if (given.get("algorithm.filter_groups.enable") or "false").lower() == "true":
        raise ConfigError(
            f"algorithm.filter_groups.enable=True: verl gives a custom replay buffer no group filter "
            f"(verl 0.9.1 trainer/ppo/v1/trainer_base.py:163-166), and {setting} needs uniagent's; {off}"
        )


def _total_steps(command: list[str], translation: Any) -> int | None:
    """The run's trainer steps, for the progress line: a local config's `trainer.steps` (verl's
    fully-async trainer counts rollout steps, not these), else `trainer.total_training_steps`."""
    if translation is not None:
        return int(translation.cfg.trainer.steps)
    steps = override_value(command, "trainer.total_training_steps")
    return int(steps) if steps and steps.isdigit() else None


def launch(recipe: str | Path, overrides: list[str]) -> int:
    """Run the recipe's command in the foreground; its exit status is ours. A local train config's
    tasks are written as verl parquet first (`local_config.prepare_data`), after the command is checked
    against this host (`host.check_host`: CUDA, the rollout backend). With a metrics file, the
    last run's is removed first (verl's logger would truncate it), but for the steps a resumed run
    had trained (`progress.keep_trained_rows`), and a progress line is printed per
    step while verl runs (`progress.follow`). When verl fails on a uniagent error, that error is
    repeated as the last line (`run_verl`)."""
    from uniagent.integrations.verl.host import check_host

    command, translation, env = _plan(recipe, overrides)
    prints = bool(HYDRA_PRINTS & {item.split("=", 1)[0] for item in command})  # hydra prints, runs nothing
    if not prints:
        check_host(command[2], command[3:], env)
    if translation is not None:
        from uniagent.integrations.verl.local_config import prepare_data

        prepare_data(translation.cfg)
    metrics = Path(env[METRICS_ENV]) if METRICS_ENV in env and not prints else None
    if metrics is None:
        return run_verl(command, {**os.environ, **env})
    from uniagent.integrations.verl.progress import follow, join_rows, keep_trained_rows

    metrics.parent.mkdir(parents=True, exist_ok=True)
    checkpoints = override_value(command, "trainer.default_local_dir")
    keep_trained_rows(metrics, Path(checkpoints).expanduser() if checkpoints else None)
    done = threading.Event()
    follower = threading.Thread(
        target=follow, args=(metrics, _total_steps(command, translation), done), daemon=True
    )
    follower.start()

    def settle() -> None:  # the last progress line before run_verl's closing error line
        done.set()
        follower.join(timeout=30)

    try:
        return run_verl(command, {**os.environ, **env}, settle)
    finally:
        settle()
        join_rows(metrics)


_UNIAGENT_ERROR = re.compile(r"uniagent\.errors\.(\w+): (.+)$")
_ANSI = re.compile(rb"\x1b\[[0-9;]*m")


def run_verl(command: list[str], env: dict[str, str], settle: Callable[[], None] | None = None) -> int:
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
    if settle is not None:  # whatever else prints about the run, before the last line
        settle()
    if code and last:
        print(f"error: {last[0]}", file=sys.stderr, flush=True)
    return code
