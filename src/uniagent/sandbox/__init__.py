"""Where commands run. `create(config)` returns an unstarted Sandbox for any backend."""

from __future__ import annotations

from typing import Any

from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import (
    ContainerConfig,
    DeployConfig,
    HostConfig,
    Limits,
    LocalConfig,
    ModalConfig,
    SweRexConfig,
    parse_config,
)
from uniagent.sandbox.shell import ExecResult, ShellSession

__all__ = [
    "ContainerConfig",
    "DeployConfig",
    "ExecResult",
    "HostConfig",
    "Limits",
    "LocalConfig",
    "ModalConfig",
    "Sandbox",
    "ShellSession",
    "SweRexConfig",
    "create",
    "parse_config",
]


def create(config: Any = None) -> Sandbox:
    """Build an unstarted sandbox from a DeployConfig or a dict such as `{"type": "local"}`."""
    cfg = parse_config(config)
    if isinstance(cfg, LocalConfig):
        from uniagent.sandbox.local import LocalSandbox

        return LocalSandbox(cfg)
    if isinstance(cfg, HostConfig):
        from uniagent.sandbox.host import HostSandbox

        return HostSandbox(cfg)
    if isinstance(cfg, ContainerConfig):
        from uniagent.sandbox.container import ContainerSandbox

        return ContainerSandbox(cfg)
    if isinstance(cfg, SweRexConfig):
        from uniagent.sandbox.swerex import SweRexSandbox

        return SweRexSandbox(cfg)
    from uniagent.sandbox.modal import ModalSandbox

    return ModalSandbox(cfg)
