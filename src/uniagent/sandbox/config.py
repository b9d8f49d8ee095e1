"""Where an episode's commands run: parsing a sandbox config by its `type` into the config class
of that backend (a `SandboxConfig`, sandbox/settings.py; each backend's own lives in its module,
found through the backend registry, sandbox/registry.py), and `create`, which builds the backend's
sandbox from it.

A `sandbox:` section is parsed once, when its settings load (`SandboxSection`); from there on it
is the backend's typed config: `Task.sandbox_config` completes it into another typed config (a
row's image: `image_config`), and `sandbox.create` hands it to the backend as is. What the user
set is the model's `model_fields_set`, so moving settings onto another backend (`retarget`) carries
exactly those.

Isolation is the default (`local`: bubblewrap, no network, writes only to its workspace);
anything weaker is an explicit choice in the config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, ValidationError

from uniagent.config import first_error
from uniagent.errors import ConfigError
from uniagent.sandbox.registry import backend
from uniagent.sandbox.settings import SandboxConfig, type_of

if TYPE_CHECKING:
    from uniagent.sandbox.base import Sandbox


_CONSENTS = frozenset({"i_understand_there_is_no_isolation"})
"""Opt-ins to less isolation: meaningless (not wrong) on a backend that isolates."""
_MOVED = {
    "default_timeout_s": "a model's command timeout is `agent.command_timeout_s` (one setting for "
    "every agent: the bash tool, str_replace_editor and harnesses); move the value there",
}


def parse_config(config: Any) -> SandboxConfig:
    """A config object, or a dict like `{"type": "local", ...}` (no `type`: local); any type of
    the backend registry, validated by that backend's own config class (only its module is
    imported)."""
    if isinstance(config, SandboxConfig):
        return config
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ConfigError(f"sandbox config must be a mapping with a `type`, got {type(config).__name__}")
    data = {"type": "local", **config}
    for key, why in _MOVED.items():
        if key in data:
            raise ConfigError(f"sandbox.{key} is no longer a setting: {why}")
    try:
        cls = backend(str(data["type"])).config_class()
    except ConfigError as exc:
        raise ConfigError(f"sandbox.type: {exc}") from None
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"sandbox.{first_error(exc, where='type')}") from None


def as_written(config: SandboxConfig) -> dict[str, Any]:
    """A typed section as the user wrote it (the keys set, and its `type`), JSON-ready: what a run's
    `config.yaml` shows and what a Ray actor re-parses into the same model (the same keys set, so
    `retarget` still carries only the user's choices)."""
    return {**config.model_dump(mode="json", exclude_unset=True), "type": type_of(config)}


SandboxSection = Annotated[
    SandboxConfig, BeforeValidator(lambda data: parse_config(data)), PlainSerializer(as_written)
]
"""The type of every settings model's `sandbox` field (run, train, the verl agent loop): parsed
once, by `type`, into the backend's own config class (a `ConfigError` naming the key); dumped as
written (`as_written`)."""


def default_section() -> SandboxConfig:
    """A settings model's default `sandbox`: the local backend, nothing set."""
    return parse_config(None)


def _settings(config: Any) -> dict[str, Any]:
    """What the user set, as a dict with its `type`: a model's explicitly set fields only, so
    that a default of one backend never counts as a choice to carry elsewhere (a dict is parsed
    first: the user's own mistakes are named as such, before any move)."""
    cfg = parse_config(config)
    return {**cfg.model_dump(exclude_unset=True), "type": type_of(cfg)}


def retarget(config: Any, type: str, **fields: Any) -> SandboxConfig:
    """The user's sandbox settings moved onto backend `type`, with `fields` on top.

    For a task whose environment dictates the backend (a row's image needs a container): every
    setting the target backend has carries over (limits, env, network, timeouts, runtime...);
    `fields` are what the task dictates and win. A setting the target has no way to honour (a
    local `rootfs` on a container) is a ConfigError naming it, never silently dropped.
    """
    target = backend(type).config_class()
    data = _settings(config)
    source = data.pop("type")
    if source != type:
        for key in list(data):
            if key in _CONSENTS:
                del data[key]
            elif key not in target.model_fields:
                why = f" for image {fields['image']}" if fields.get("image") else ""
                raise ConfigError(
                    f"sandbox.{key}: this task runs in a {type} sandbox{why}, which cannot honour "
                    f"the {source} setting `{key}`; remove it from the sandbox config (or run "
                    f"only tasks without an image)"
                )
    return parse_config({**data, **fields, "type": type})


def image_config(config: Any, image: str, workdir: str) -> SandboxConfig:
    """The sandbox for a task that must run in `image` with its project at `workdir`, keeping
    the user's settings (see `retarget`). Backends without images (local, host) become a
    container; container and modal keep their type; a SWE-ReX server uniagent starts runs in
    its `inner` container. A running SWE-ReX server has its own environment, so it cannot."""
    cfg = parse_config(config)
    kind = type_of(cfg)
    if backend(kind).images:
        return retarget(cfg, kind, image=image, workdir=workdir)
    if kind != "swerex":
        return retarget(cfg, "container", image=image, workdir=workdir)
    if getattr(cfg, "url", None):
        raise ConfigError(
            f"sandbox.url: this task runs in image {image}, but a running SWE-ReX server has its "
            "own environment; unset `url` and give `inner: {type: container, network: true, "
            "run_args: [--network, host]}` so that uniagent starts the server in the image"
        )
    inner = getattr(cfg, "inner", None)  # typed when the section loaded (SweRexConfig)
    if inner is None or type_of(inner) != "container":
        raise ConfigError(
            f"sandbox.inner: this task runs in image {image}; a SWE-ReX server uniagent starts runs "
            "in the image only inside a container: set `inner: {type: container, network: true, "
            "run_args: [--network, host]}` (the image needs `swe-rex` installed)"
        )
    inner_cfg = retarget(inner, "container", image=image, workdir=workdir)
    return retarget(cfg, "swerex", inner=inner_cfg, workdir=workdir)


def create(config: Any = None) -> Sandbox:
    """Build an unstarted sandbox from a typed config (as is) or a dict such as `{"type": "local"}`
    (parsed by its `type`)."""
    cfg = parse_config(config)
    return backend(type_of(cfg)).sandbox_class()(cfg)
