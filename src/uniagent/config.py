"""The one config loader: a YAML file, flags, dotted `--set` overrides, validated into a pydantic
model whose first error is one line naming the key.

`uniagent run`, `uniagent train` and the verl integration all load their settings here. It sits
at the bottom of the layers (it imports nothing of the project but `errors`): a section that
needs checking against a registry (the sandbox section) carries its own validator in its type
(`uniagent.sandbox.config.SandboxSection`), and a `ConfigError` such a validator raises comes out
of `validate_config` with the same `config ` prefix as pydantic's own errors.

A key that moved is one line of `RENAMED`, by the settings model's class name: an old key in the
data is a one-line `ConfigError` naming the new key, checked before validation (so the error is
the move, not pydantic's "extra inputs are not permitted").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from uniagent.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

_AGENT_KEYS = {
    "agent_kind": "agent.kind",
    "agent.max_tokens_per_turn": "model.max_tokens",  # the per-turn cap has one name
}
RENAMED: dict[str, dict[str, str]] = {
    "RunConfig": _AGENT_KEYS,
    "TrainConfig": _AGENT_KEYS,
    "UniAgentLoopSettings": {
        **_AGENT_KEYS,
        "max_tokens_per_turn": "model.max_tokens",
        "parser": "model.parser",
        "native_tools": "model.template_tools",
    },
}
"""Old dotted key -> its new dotted key, per settings model (by class name: this module sits below
every settings model and imports none of them)."""


def check_renamed(model: type[BaseModel], data: dict[str, Any]) -> None:
    """A `ConfigError` for the first key of `data` that `RENAMED` lists for `model`."""
    for old, new in RENAMED.get(model.__name__, {}).items():
        node: Any = data
        for part in old.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            raise ConfigError(f"{old} is now {new}: set {new} instead")


class HasErrors(Protocol):
    """pydantic's `ValidationError` and what wraps one (FastAPI's `RequestValidationError`)."""

    def errors(self) -> Any: ...


def first_error(exc: ValidationError | HasErrors, skip: int = 0, where: str = "") -> str:
    """`KEY.PATH: message` of pydantic's first error, `skip` leading location parts dropped (a
    union's tag is not a key the user wrote); `where` names an error with no location left."""
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in list(err['loc'])[skip:]) or where}: {err['msg']}"


def set_dotted(data: dict[str, Any], key: str, raw: str) -> None:
    """`a.b.c=value`, the value parsed as YAML (numbers, booleans, lists work)."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"--set {key}: empty key segment")
    node = data
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
        node = nxt
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        node[parts[-1]] = raw


def load_config_data(
    path: Path | None = None, overrides: list[str] | None = None, flags: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A YAML file (optional), then flags, then `KEY=VALUE` overrides, as one nested dict."""
    data: dict[str, Any] = {}
    if path is not None:
        if not Path(path).exists():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping")
    for key, value in (flags or {}).items():
        if value is not None:
            set_dotted(data, key, value if isinstance(value, str) else yaml.safe_dump(value).strip())
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        set_dotted(data, key.strip(), value)
    return data


def validate_config(model: type[M], data: dict[str, Any]) -> M:
    """`data` as `model`; the first error becomes one `ConfigError` line naming the key (a key that
    moved names its new key)."""
    try:
        check_renamed(model, data)
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"config {first_error(exc)}") from None
    except ConfigError as exc:  # a section's own validator (the sandbox registry's check)
        raise ConfigError(f"config {exc}") from None


def build(
    model: type[M],
    path: Path | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> M:
    """Load and validate in one step: what every command's config goes through."""
    return validate_config(model, load_config_data(path, overrides, flags))
