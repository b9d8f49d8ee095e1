"""Where commands run. `create(config)` returns an unstarted Sandbox for any backend of the
registry (sandbox/registry.py: one module plus one line per backend)."""

from __future__ import annotations

from uniagent.sandbox.base import Sandbox, Session
from uniagent.sandbox.config import (
    ContainerConfig,
    HostConfig,
    Limits,
    LocalConfig,
    ModalConfig,
    SandboxConfig,
    SweRexConfig,
    parse_config,
)
from uniagent.sandbox.pipe import PipeShellSandbox
from uniagent.sandbox.registry import BACKENDS, DeployConfig, create
from uniagent.sandbox.shell import ExecResult, ShellSession

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
