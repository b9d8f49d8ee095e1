"""The sandbox backend registry: every `type` a sandbox config can have is one line in
`BACKENDS` (a `uniagent.registry.Registry`, the shape of every extension table).

A backend is one module holding its typed config (a `SandboxConfig` subclass with `type:
Literal[NAME]`), its Sandbox class and its health check `async def doctor_check() -> list[(name,
ok, detail)]`, plus one line below naming the class (`"module:Class"`), the config (an attribute
of that module) and whether a task's image runs in it. Nothing is imported until a config of
that type is parsed or a sandbox created, so a config costs only its own backend's imports.
`sandbox.create`, `parse_config`, `retarget` (sandbox/config.py) and `uniagent doctor` all go
through this table, which imports no backend and nothing of the sandbox package but its settings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field

from uniagent.registry import Entry, Registry
from uniagent.sandbox.settings import SandboxConfig

if TYPE_CHECKING:
    from uniagent.sandbox.base import Sandbox


@dataclass(frozen=True)
class Backend(Entry):
    """One sandbox backend: `target` is its Sandbox class, `config` its config class (an attribute
    of the same module, or `"module:Class"`). `images`: a task that needs a container image runs in
    this backend itself (container, modal); otherwise such a task moves to a container (see
    `image_config`). Its doctor check is the module's `doctor_check` unless `doctor` says else."""

    config: str = ""
    images: bool = False

    def __post_init__(self) -> None:
        if self.doctor is None:
            object.__setattr__(self, "doctor", f"{self.module}:doctor_check")

    @property
    def name(self) -> str:
        """The `type` its config declares (the table's key; a test checks they agree)."""
        return str(self.config_class().model_fields["type"].default)

    def config_class(self) -> type[SandboxConfig]:
        ref = self.config if ":" in self.config else f"{self.module}:{self.config}"
        cls: type[SandboxConfig] = BACKENDS.resolve(self._key(), ref)
        return cls

    def sandbox_class(self) -> type[Sandbox]:
        cls: type[Sandbox] = BACKENDS.resolve(self._key(), self.target)
        return cls

    def _key(self) -> str:
        """This line's name in `BACKENDS` (a line knows its target, not the key it is filed under)."""
        return next((name for name, entry in BACKENDS.items() if entry is self), self.module)


# One line per backend; the key is its config's `type`.
BACKENDS = Registry(
    "sandbox type",
    {
        "local": Backend(
            "uniagent.sandbox.local:LocalSandbox", "the default: bubblewrap, isolated", config="LocalConfig"
        ),
        "host": Backend("uniagent.sandbox.host:HostSandbox", "no isolation, opt-in", config="HostConfig"),
        "container": Backend(
            "uniagent.sandbox.container:ContainerSandbox",
            "docker, podman or apptainer",
            config="ContainerConfig",
            images=True,
        ),
        "swerex": Backend("uniagent.sandbox.swerex:SweRexSandbox", "a SWE-ReX server", config="SweRexConfig"),
        "modal": Backend(
            "uniagent.sandbox.modal:ModalSandbox",
            "Modal's cloud",
            config="ModalConfig",
            images=True,
            install="pip install 'uniagent[modal]'",
        ),
    },
)


def backend(type: str) -> Backend:
    """The registered backend of a config `type`; an unknown one is a ConfigError listing them."""
    found: Backend = BACKENDS.entry(type)
    return found


def deploy_config() -> Any:
    """Any backend's config: a pydantic union discriminated on `type` (imports every backend)."""
    return _union(tuple(backend(name).config_class() for name in BACKENDS))


@functools.cache
def _union(configs: tuple[type[SandboxConfig], ...]) -> Any:
    return Annotated[Union[configs], Field(discriminator="type")]  # noqa: UP007  (built from the table)


def __getattr__(name: str) -> Any:
    """`DeployConfig`, built on first use (it imports every backend's module)."""
    if name == "DeployConfig":
        return deploy_config()
    raise AttributeError(name)
