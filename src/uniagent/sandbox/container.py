"""Containers through their command-line tools: docker, podman (OCI, container_oci.py) and
apptainer (apptainer.py).

Every call is an asyncio subprocess of the runtime's CLI, so nothing blocks the event loop
and no SDK is needed. One long-lived container per sandbox; each shell session is a
`<cli> exec` into it, and timeouts reach the command's process tree through a second exec
that walks /proc inside the container (the pipe-shell default). This module is the
backend (the `BACKENDS` line names it): its config and class come from container_base.py (what
the runtimes share), it loads every runtime's class (each registers itself), and it holds the
health check.
"""

from __future__ import annotations

import shutil

from uniagent.errors import SandboxError
from uniagent.sandbox import apptainer, container_oci
from uniagent.sandbox.container_base import CliResult, ContainerConfig, ContainerSandbox, run_cli

RUNTIME_CLASSES = (container_oci.OciSandbox, apptainer.ApptainerSandbox)
"""Every runtime's class (imported here so that each is registered with `ContainerSandbox`)."""

__all__ = ["CliResult", "ContainerConfig", "ContainerSandbox", "doctor_check", "run_cli"]


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor`: reach each installed runtime (docker/podman: the daemon or its
    storage, through `info`; apptainer: its version). Not installed is `None`, not a failure."""
    rows: list[tuple[str, bool | None, str]] = []
    queries = {
        "docker": ["info", "--format", "server {{.ServerVersion}}, {{.Driver}} storage"],
        "podman": ["info", "--format", "podman {{.Version.Version}}, {{.Store.GraphDriverName}} storage"],
        "apptainer": ["--version"],
    }
    for runtime, args in queries.items():
        name = f"sandbox container ({runtime})"
        exe = shutil.which(runtime) or (shutil.which("singularity") if runtime == "apptainer" else None)
        if exe is None:
            rows.append((name, None, f"{runtime} not installed"))
            continue
        try:
            res = await run_cli([exe, *args], timeout=20)
        except SandboxError as exc:
            rows.append((name, False, str(exc)[:200]))
            continue
        if res.ok:
            rows.append((name, True, res.out.decode(errors="replace").strip()[:200]))
        else:
            why = res.message().splitlines()[-1][:200]
            rows.append((name, False, f"`{runtime} {args[0]}` failed: {why}"))
    return rows
