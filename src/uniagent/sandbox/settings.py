"""What every sandbox backend's config has (`SandboxConfig`, with its resource `Limits`): the
lowest piece of the sandbox package. The backend registry (registry.py), the parsing of a config
by its `type` (config.py) and every backend's own config class build on it; it imports none of
them, so none of them import each other in a circle.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Resource limits. `None` means no limit. Backends apply what they can and log the rest."""

    model_config = ConfigDict(extra="forbid")

    memory_mb: int | None = Field(4096, ge=16)
    pids: int | None = Field(512, ge=8)
    cpu_time_s: int | None = Field(None, ge=1, description="CPU seconds per process (RLIMIT_CPU)")
    file_size_mb: int | None = Field(1024, ge=1, description="largest file a process may write")
    open_files: int | None = Field(1024, ge=16)
    wall_clock_s: float | None = Field(None, gt=0, description="the sandbox is stopped this long after start")
    cpus: float | None = Field(None, gt=0, description="CPU share (containers, cgroup cpu quota)")

    def rlimits(self, address_space: bool = False) -> dict[str, int]:
        """The per-process limits in the kernel's units (count, bytes, seconds), keyed by the
        names prlimit and `docker --ulimit` share (`resource.RLIMIT_<NAME>`). `address_space`
        adds memory as RLIMIT_AS: the fallback where no memory cgroup holds the tree. Every
        backend renders its flags from this one list, so they cannot drift apart."""
        out: dict[str, int] = {}
        if self.open_files:
            out["nofile"] = self.open_files
        if self.file_size_mb:
            out["fsize"] = self.file_size_mb << 20
        if self.cpu_time_s:
            out["cpu"] = self.cpu_time_s
        if address_space and self.memory_mb:
            out["as"] = self.memory_mb << 20
        return out

    def ulimit_lines(self) -> list[str]:
        """`rlimits` as bash `ulimit` commands, for backends whose sessions set them themselves
        (no rlimit flag of their own). bash counts file size in 1 KiB blocks."""
        flag = {"nofile": "-n", "fsize": "-f", "cpu": "-t"}
        return [f"ulimit {flag[k]} {v >> 10 if k == 'fsize' else v}" for k, v in self.rlimits().items()]

    def cgroup_flags(self, mb_suffix: str = "m", no_swap: bool = False) -> list[str]:
        """The cgroup limits (memory, pids, cpus) as the flags docker, podman and apptainer
        share; `no_swap` pins swap to the memory limit, so it is real, not "memory + as much
        swap again"."""
        flags: list[str] = []
        if self.memory_mb:
            flags += ["--memory", f"{self.memory_mb}{mb_suffix}"]
            if no_swap:
                flags += ["--memory-swap", f"{self.memory_mb}{mb_suffix}"]
        if self.pids:
            flags += ["--pids-limit", str(self.pids)]
        if self.cpus:
            flags += ["--cpus", f"{self.cpus:g}"]
        return flags


class SandboxConfig(BaseModel):
    """What every backend's config has; each backend's own adds `type: Literal[NAME]` and more."""

    model_config = ConfigDict(extra="forbid")

    workdir: str = Field("/workspace", description="the agent's working directory inside the sandbox")
    env: dict[str, str] = Field(default_factory=dict, description="set in every shell of the sandbox")
    limits: Limits = Field(default_factory=Limits)
    max_output_chars: int = Field(30_000, ge=200, description="observations are clipped to this")
    start_timeout_s: float = Field(120.0, gt=0)
    start_retries: int = Field(2, ge=0)


def type_of(config: SandboxConfig) -> str:
    """A config's backend `type` (each backend's config class declares its own)."""
    return str(type(config).model_fields["type"].default)
