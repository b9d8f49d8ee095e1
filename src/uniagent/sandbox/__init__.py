"""Where commands run. `create(config)` returns an unstarted Sandbox for any backend of the
registry (sandbox/registry.py: one module plus one line per backend).

Each backend's config class lives in its backend's module; the names below (`LocalConfig`,
`ModalConfig`, ..., `DeployConfig`) are looked up there on first use, so importing this package
costs no backend's imports."""

from __future__ import annotations

from typing import Any

from uniagent.sandbox.base import Sandbox, Session
from uniagent.sandbox.config import create, parse_config
from uniagent.sandbox.pipe import PipeShellSandbox
from uniagent.sandbox.registry import BACKENDS
from uniagent.sandbox.settings import Limits, SandboxConfig
from uniagent.sandbox.shell import ExecResult, ShellSession

_CONFIGS = {
    "ContainerConfig": "container",
    "HostConfig": "host",
    "LocalConfig": "local",
    "ModalConfig": "modal",
    "SweRexConfig": "swerex",
}


def __getattr__(name: str) -> Any:
    """A built-in backend's config class (from its module, through the table), or `DeployConfig`."""
    from uniagent.sandbox import registry

    if name in _CONFIGS:
        return registry.backend(_CONFIGS[name]).config_class()
    if name == "DeployConfig":
        return registry.deploy_config()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "ContainerConfig",
    "DeployConfig",
    "ExecResult",
    "HostConfig",
    "Limits",
    "LocalConfig",
    "ModalConfig",
    "PipeShellSandbox",
    "Sandbox",
    "SandboxConfig",
    "Session",
    "ShellSession",
    "SweRexConfig",
    "create",
    "parse_config",
]
