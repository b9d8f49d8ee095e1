"""The sandbox backend registry: every `type` a sandbox config can have is one line in
`BACKENDS`, like the engine registry (models/registry.py) for model specs.

A line gives the backend's pydantic config class (with `type: Literal[NAME]`), where its Sandbox
class lives (`"module:Class"`, imported only when one is created, so a config costs no backend's
imports), and whether a task's image runs in it. Its health check is `async def doctor_check()
-> list[(name, ok, detail)]` in that same module, beside its code (`uniagent doctor` finds it
here). `sandbox.create`, `parse_config`, `retarget` and doctor all go through this table, so
adding a backend is one module (config class, Sandbox, doctor_check) plus one line below.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field, TypeAdapter

from uniagent.errors import ConfigError
from uniagent.sandbox.config import (
    ContainerConfig,
    HostConfig,
    LocalConfig,
    ModalConfig,
    SandboxConfig,
    SweRexConfig,
    parse_config,
    type_of,
)

if TYPE_CHECKING:
    from uniagent.sandbox.base import Sandbox


@dataclass(frozen=True)
class Backend:
    """One sandbox backend. `images`: a task that needs a container image runs in this backend
    itself (container, modal); otherwise such a task moves to a container (see `image_config`)."""

    config: type[SandboxConfig]
    sandbox: str
    images: bool = False

    @property
    def name(self) -> str:
        return str(self.config.model_fields["type"].default)

    @property
    def module(self) -> str:
        """The backend's module: its Sandbox and its `doctor_check`."""
        return self.sandbox.partition(":")[0]

    def sandbox_class(self) -> type[Sandbox]:
        module, _, attr = self.sandbox.partition(":")
        try:
            cls: type[Sandbox] = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"sandbox type {self.name!r} needs the Python package {exc.name!r}: install it "
                f"(pip install {exc.name})"
            ) from None
        return cls


# One line per backend; the key is its config's `type`.
BACKENDS: dict[str, Backend] = {
    "local": Backend(LocalConfig, "uniagent.sandbox.local:LocalSandbox"),
    "host": Backend(HostConfig, "uniagent.sandbox.host:HostSandbox"),
    "container": Backend(ContainerConfig, "uniagent.sandbox.container:ContainerSandbox", images=True),
    "swerex": Backend(SweRexConfig, "uniagent.sandbox.swerex:SweRexSandbox"),
    "modal": Backend(ModalConfig, "uniagent.sandbox.modal:ModalSandbox", images=True),
}
for _name, _backend in BACKENDS.items():
    if _backend.name != _name:
        raise TypeError(f"BACKENDS[{_name!r}] holds a config of type {_backend.name!r}")


def _union(configs: tuple[type[SandboxConfig], ...]) -> Any:
    return Annotated[Union[configs], Field(discriminator="type")]  # noqa: UP007  (built from the table)


DeployConfig = _union(tuple(b.config for b in BACKENDS.values()))
"""Any backend's config: a pydantic union discriminated on `type`."""


def adapter() -> TypeAdapter[Any]:
    """The validator of the union of every backend registered now."""
    return _adapter(tuple(b.config for b in BACKENDS.values()))


@functools.cache
def _adapter(configs: tuple[type[SandboxConfig], ...]) -> TypeAdapter[Any]:
    return TypeAdapter(_union(configs))


def backend(type: str) -> Backend:
    """The registered backend of a config `type`; an unknown one is a ConfigError listing them."""
    found = BACKENDS.get(type)
    if found is None:
        raise ConfigError(f"unknown sandbox type {type!r}; known: {', '.join(BACKENDS)}")
    return found


def create(config: Any = None) -> Sandbox:
    """Build an unstarted sandbox from a config object or a dict such as `{"type": "local"}`."""
    cfg = parse_config(config)
    return backend(type_of(cfg)).sandbox_class()(cfg)
