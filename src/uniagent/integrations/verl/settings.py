"""What a verl run may set for uniagent, validated by the loader `uniagent run` uses.

Settings reach `UniAgentLoop` from two places: the keys of its agent-loop YAML entry (hydra passes
them as kwargs) and, overriding those, the trainer config's `uniagent:` section
(`+uniagent.agent.max_turns=20`). Both are checked here, with `uniagent.config.validate_config` and
the sandbox union, so a misspelt key is a one-line `ConfigError` naming it, never a run where
every episode ends in `internal_error` and verl trains on all-zero masks.

They are checked twice, as early as each path allows:

- `uniagent verl command|launch` and `uniagent train --engine verl` check the command's agent-loop
  YAML and its `uniagent.*` overrides before printing or launching anything (`check_overrides`);
- verl's worker builds one `UniAgentLoop` per sample; its constructor checks the merged settings
  before the sample's episode starts (`loop_settings`), which also covers a command typed by hand.

verl is not imported here, so the CLI can check a command on a machine without verl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from uniagent.agent.config import AgentConfig
from uniagent.config import RENAMED, set_dotted, validate_config
from uniagent.errors import ConfigError
from uniagent.models.config import ModelConfig
from uniagent.sandbox.config import SandboxSection, default_section

LOOP_TARGET = "uniagent.integrations.verl.loop.UniAgentLoop"
AGENT_LOOP_KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"

SHARE_FIELD = "max_infra_failure_share"
"""The `extra_fields` key where each output carries its loop's share, for the V1 sampler (`sampler.py`)."""
V1_SAMPLER = {
    "trainer.v1.sampler.custom_sampler.path": "pkg://uniagent.integrations.verl.sampler",
    "trainer.v1.sampler.custom_sampler.name": "InfraCheckedReplayBuffer",
}
"""The verl keys that make V1's replay buffer uniagent's infrastructure-failure check (`sampler.py`)."""
V1_SAMPLER_OVERRIDES = [
    *(f"{k}={v}" for k, v in V1_SAMPLER.items()),
    "+trainer.v1.sampler.sampler_kwargs.rollout_n=${actor_rollout_ref.rollout.n}",
]
"""What a `main_ppo` command under V1 adds to keep the check on (`launch.check_trainer_path`)."""


class UniAgentLoopSettings(BaseModel):
    """What the agent-loop YAML entry (and the trainer config's `uniagent:` section) may set."""

    model_config = ConfigDict(extra="forbid")

    sandbox: SandboxSection = Field(
        default_factory=default_section, description="the run's sandbox; each row completes it (an image)"
    )
    agent: AgentConfig = Field(default_factory=AgentConfig, description="who acts and the episode's budgets")
    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="the policy as an episode sees it: parser, max_tokens (per model turn; unset: "
        "rollout.response_length), template_tools, history. verl serves and samples the policy itself "
        "(actor_rollout_ref.model.path, rollout.temperature/top_p), so any other model key is refused",
    )
    untrainable_mask: Literal["zero", "keep"] = Field(
        "zero", description="zero: infrastructure failures contribute no gradient (their mask is all 0)"
    )
    max_infra_failure_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="a batch with more infrastructure failures than this share fails the step (a worker's "
        "batch; under verl's V1 trainer the step's, checked by uniagent's replay buffer: sampler.py)",
    )
    overlong_filter: bool = Field(
        False,
        description="DAPO overlong filtering (the local trainer's algo.overlong_filter): an episode cut by a "
        "length limit keeps its reward in its group's baseline with an all-zero mask (no gradient)",
    )
    unfinished: Literal["count", "baseline_only"] = Field(
        "count",
        description="the local trainer's algo.unfinished: count = trained with its reward (verl); "
        "baseline_only = an unfinished episode keeps its reward in the group with an all-zero mask. "
        "(`drop` has no counterpart: verl's group is every sample of its prompt)",
    )
    server_params: dict[str, Any] = Field(default_factory=dict, description="extra sampling keys for verl")
    max_resumes: int = Field(50, ge=0, description="aborted turns resumed before model_error")
    resume_delay_s: float = Field(1.0, ge=0.0)

    @field_validator("model")
    @classmethod
    def _what_verl_applies(cls, model: ModelConfig) -> ModelConfig:
        """`model.history` and the rest of `VERL_MODEL_KEYS` act in the loop; a key verl decides
        itself would be silently ignored, so it is an error naming verl's key."""
        other = sorted(model.model_fields_set - VERL_MODEL_KEYS)
        if other:
            raise ConfigError(
                f"model.{other[0]} does not apply in verl's agent loop: verl serves and samples the policy "
                "(actor_rollout_ref.model.path, actor_rollout_ref.rollout.*); the loop takes model."
                + ", model.".join(sorted(VERL_MODEL_KEYS))
            )
        return model

    def max_tokens(self, response_length: int) -> int:
        """The per-turn cap: `model.max_tokens` when set, else all of verl's response length."""
        return self.model.max_tokens if "max_tokens" in self.model.model_fields_set else response_length


VERL_MODEL_KEYS = frozenset({"parser", "max_tokens", "template_tools", "history"})
"""The `model:` keys the verl loop applies (`ModelConfig` is shared with run and train)."""

SETTING_KEYS = frozenset(UniAgentLoopSettings.model_fields) | {
    old.partition(".")[0] for old in RENAMED["UniAgentLoopSettings"]
}
"""The agent-loop YAML entry's keys UniAgentLoop takes (an old one, to name its new key)."""


def validate_settings(merged: dict[str, Any], entry: str) -> UniAgentLoopSettings:
    """`merged` (YAML entry keys plus the `uniagent:` section) as settings, or one `ConfigError`."""
    try:
        return validate_config(UniAgentLoopSettings, merged)
    except ConfigError as exc:
        raise ConfigError(
            f"verl agent loop {entry!r}: {exc} (set in its agent-loop YAML entry or by +uniagent.* overrides)"
        ) from None


def merge_settings(yaml_kwargs: dict[str, Any], section: dict[str, Any] | None) -> dict[str, Any]:
    """The YAML entry's keys with the trainer config's `uniagent:` section on top (dicts merge, except
    a dict naming another `type`, e.g. a local sandbox over a container one: it replaces the entry's,
    whose keys belong to the other type)."""
    merged = dict(yaml_kwargs)
    for key, value in (section or {}).items():
        old = merged.get(key)
        if (
            isinstance(value, dict)
            and isinstance(old, dict)
            and value.get("type", old.get("type")) == old.get("type")
        ):
            merged[key] = {**old, **value}
        else:
            merged[key] = value
    return merged


def _entry_kwargs(entry: dict[str, Any]) -> dict[str, Any]:
    """An agent-loop YAML entry without what hydra and verl consume themselves."""
    return {k: v for k, v in entry.items() if k not in ("_target_", "name")}


def check_agent_loop_file(
    path: str | Path, section: dict[str, Any] | None
) -> dict[str, UniAgentLoopSettings]:
    """Validate every `UniAgentLoop` entry of an agent-loop YAML with `section` applied; by name."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{AGENT_LOOP_KEY}: {file} does not exist")
    try:
        entries = yaml.safe_load(file.read_text()) or []
    except yaml.YAMLError as exc:
        raise ConfigError(f"{AGENT_LOOP_KEY}: {file} is not valid YAML: {exc}") from None
    if not isinstance(entries, list):
        raise ConfigError(f"{AGENT_LOOP_KEY}: {file} must hold a list of agent-loop entries")
    checked = {}
    for entry in entries:
        if isinstance(entry, dict) and entry.get("_target_") == LOOP_TARGET:
            name = str(entry.get("name"))
            checked[name] = validate_settings(merge_settings(_entry_kwargs(entry), section), name)
    return checked


def uniagent_section(overrides: list[str]) -> dict[str, Any]:
    """The trainer config's `uniagent:` section that hydra overrides (`+uniagent.a.b=v`) build."""
    section: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.lstrip("+")
        if not sep or key.startswith("~") or not key.startswith("uniagent."):
            continue
        set_dotted(section, key.removeprefix("uniagent."), value)
    return section


def check_overrides(overrides: list[str]) -> dict[str, UniAgentLoopSettings]:
    """Check the uniagent settings a verl command passes (its agent-loop YAML plus `uniagent.*`);
    each `UniAgentLoop` entry's settings by name."""
    section = uniagent_section(overrides)
    paths = [o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+") == AGENT_LOOP_KEY]
    if not paths:
        if section:
            raise ConfigError(
                f"uniagent.* overrides are given but no {AGENT_LOOP_KEY}; "
                "point it at uniagent's agent-loop YAML"
            )
        return {}
    return check_agent_loop_file(paths[-1], section)
