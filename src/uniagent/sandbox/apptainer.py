"""apptainer (or singularity) instances, driven through the CLI.

`instance start` / `exec instance://` / `instance stop`, with `--containall`, a host temp dir
bound at `workdir` (an image is read-only; a writable tmpfs is small), no network unless asked,
cgroup flags for memory/pids/cpus, and rlimits from the session preamble (apptainer has no
`--ulimit`). Files go through the shell (the Sandbox default).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from uniagent.errors import SandboxError, SandboxStartError
from uniagent.sandbox import procs
from uniagent.sandbox.container_base import ContainerConfig, ContainerSandbox


class ApptainerSandbox(ContainerSandbox):
    """An apptainer instance (built by `ContainerSandbox(config)` for `runtime: apptainer`)."""

    runtimes = ("apptainer",)

    def __init__(self, config: ContainerConfig) -> None:
        super().__init__(config)
        self._workspace: str | None = None  # the host dir bound at workdir

    def _default_cli(self) -> str:
        return shutil.which("apptainer") or shutil.which("singularity") or "apptainer"

    async def _prepare_image(self) -> None:
        if self.config.build:
            raise SandboxStartError(
                f"image {self.config.image!r} must be built from {self.config.build}: apptainer cannot "
                "build a Dockerfile here; build it with docker or podman, or run with runtime docker/podman"
            )
        self._image_ref = self._image()

    def _exec_argv(self, argv: list[str]) -> list[str]:
        env = [f"--env={k}={v}" for k, v in self.config.env.items()]
        return [self.cli, "exec", "--cleanenv", *env, f"instance://{self.name}", *argv]

    async def _alive(self) -> bool:
        try:
            res = await self._cli("instance", "list", "--json", self.name, timeout=30)
            return res.ok and bool(json.loads(res.out or b"{}").get("instances"))
        except (SandboxError, ValueError):
            return False

    def _image(self) -> str:
        image = self.config.image
        if "://" not in image and Path(image).exists():
            return str(Path(image).resolve())
        uri = image if "://" in image else f"docker://{image}"
        if self.config.pull == "never":
            raise SandboxStartError(
                f"image {image!r} is not a local SIF file or sandbox directory and pull is 'never'; "
                f"run `apptainer pull` first and set image to the .sif path"
            )
        return uri

    def _preamble(self) -> str:
        """apptainer has no --ulimit: every session sets the rlimits itself before any command."""
        base = super()._preamble()
        lines = self.config.limits.ulimit_lines()
        return "\n".join([*(f"{x} 2>/dev/null || true" for x in lines), base])

    async def _launch(self) -> None:
        cfg, lim = self.config, self.config.limits
        # uniagent-ws-<pid>-...: a later process removes it if this one is killed with -9
        self._workspace = str(await asyncio.to_thread(procs.owned_tempdir, "uniagent-ws-"))
        args = [
            "instance", "start", "--containall", "--writable-tmpfs",
            "--bind", f"{self._workspace}:{self.workdir}",
        ]  # fmt: skip
        if not cfg.network:
            args += ["--net", "--network", "none"]
        if cfg.pull == "always":
            args.append("--disable-cache")
        cgroup_flags = lim.cgroup_flags(mb_suffix="M")
        for key, value in cfg.env.items():
            args.append(f"--env={key}={value}")
        args += [*cgroup_flags, *cfg.run_args, self._image_ref, self.name]
        res = await self._cli(*args, timeout=None)
        if not res.ok:
            hint = ""
            if cgroup_flags and "cgroup" in res.message().lower():
                hint = (
                    " (memory/pids/cpus limits need cgroups this user may control; set "
                    "limits.memory_mb, limits.pids and limits.cpus to null to run without them)"
                )
            raise SandboxStartError(
                f"`apptainer instance start {self._image_ref}` failed: {res.message()}{hint}"
            )

    async def _stop(self) -> None:
        try:
            res = await self._cli("instance", "stop", "--force", self.name)
            msg = res.message().lower()
            if not res.ok and "no instance found" not in msg and "not found" not in msg:
                raise SandboxError(f"could not stop {self._what()}: {res.message()}")
        finally:
            if self._workspace:
                shutil.rmtree(self._workspace, ignore_errors=True)
                self._workspace = None
