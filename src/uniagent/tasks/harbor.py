"""Harbor tasks (Terminal-Bench 2.x and Harbor packagings): a task directory's instruction acted on
by any agent, graded by the task's own verifier as Harbor grades it.

The task directory is read and validated by `harbor_config` (`--tasks harbor:DIR`, one task or a
folder of them). An episode:

- sandbox (`sandbox_config`): the bubblewrap sandbox when the Dockerfile only places files
  (FROM, WORKDIR, COPY/ADD of the environment's own files, ENV) and the run's sandbox is local;
  else a container of `environment.docker_image`, or of the Dockerfile's FROM image when the
  Dockerfile only places files, or of an image built from environment/ (docker/podman `build`,
  once, named by the directory's content). `cpus`, `memory_mb` and
  `allow_internet` become the sandbox's limits and network; `agent.timeout_sec` bounds the agent
  (`agent.wall_time_s`) and `verifier.timeout_sec` the tests;
- setup: the Dockerfile's COPY/ADD files placed in the sandbox, nothing else (the tests and the
  solution are not there while the agent works);
- grading (`carries = "sandbox"`: the verifier reads the sandbox as the agent left it, as Harbor's
  does): /tests and /logs/verifier are emptied, tests/ is uploaded to /tests, `bash
  /tests/test.sh` runs as `verifier.user` with `verifier.env` within `verifier.timeout_sec`, and
  the reward is read from /logs/verifier/reward.txt (one number) or reward.json (named numbers,
  all kept in the reward's details). A test.sh that runs past its timeout or writes no reward is
  a verifier failure (the episode's `verifier_error`, untrainable), never a reward of 0.

`grade_oracle` runs solution/solve.sh before the verifier: `uniagent verify --gold`'s gate.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import posixpath
import re
from pathlib import Path
from typing import Any

from uniagent.agent.config import AgentConfig
from uniagent.agent.result import EpisodeResult, Reward
from uniagent.errors import ConfigError, SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import SandboxConfig, parse_config, retarget
from uniagent.sandbox.procs import quote
from uniagent.sandbox.registry import backend
from uniagent.sandbox.settings import type_of
from uniagent.tasks.base import SYSTEM_PROMPT, Task
from uniagent.tasks.harbor_config import (
    LOGS_DIR,
    SOLUTION_DIR,
    TESTS_DIR,
    VERIFIER_LOGS,
    HarborDir,
    read_task_dir,
)

PROMPT = """{instruction}

Your working directory is {workdir}. You can run commands with `bash` and edit files with
`str_replace_editor`. When the task is done, call `submit`."""
PRIVATE_DIRS = (TESTS_DIR, SOLUTION_DIR, LOGS_DIR)
"""Harbor's own paths: private writable directories in the bubblewrap sandbox."""
LOG_TAIL = 4000


def as_user(command: str, user: str | None) -> str:
    """`command` run as `user` (Harbor's `agent.user` / `verifier.user`; None: as is), with
    util-linux's `setpriv` (no PAM needed), else `su`."""
    if not user:
        return command
    u, c = quote(user), quote(command)
    return (
        f"if command -v setpriv >/dev/null; then setpriv --reuid={u} --regid=$(id -g {u}) "
        f"--init-groups bash -c {c}; else su -s /bin/bash {u} -c {c}; fi"
    )


def parse_reward(txt: str | None, js: str | None) -> tuple[float, dict[str, float]]:
    """(the reward, every named reward) from Harbor's files: reward.txt holds one number;
    reward.json an object of numbers, whose `reward` key is the reward (else the one value, else
    their mean). A file that says something else is the verifier's failure."""
    if txt is not None and txt.strip():
        try:
            value = float(txt.strip())
        except ValueError:
            raise SandboxError(f"reward.txt is not a number: {txt.strip()[:80]!r}") from None
        return value, {"reward": value}
    if js is None:
        raise SandboxError("the verifier wrote no reward (/logs/verifier/reward.txt or reward.json)")
    try:
        data = json.loads(js)
    except json.JSONDecodeError:
        raise SandboxError(f"reward.json is not JSON: {js.strip()[:80]!r}") from None
    if not isinstance(data, dict) or not data:
        raise SandboxError("reward.json must be an object of named numbers")
    named: dict[str, float] = {}
    for key, v in data.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise SandboxError(f"reward.json: {key!r} is not a number")
        named[str(key)] = float(v)
    value = named.get("reward", next(iter(named.values())) if len(named) == 1 else None)
    if value is None:
        value = sum(named.values()) / len(named)
    return value, named


class HarborTask(Task):
    """One Harbor task directory (row: `task_dir`, from `harbor_config.task_rows`)."""

    family = "harbor"
    carries = "sandbox"

    def __init__(self, row: dict[str, Any], source: str | None = None) -> None:
        super().__init__(row, source)
        if not row.get("task_dir"):
            raise ConfigError("a harbor row needs `task_dir` (a Harbor task directory)")
        path = Path(str(row["task_dir"]))
        if not path.is_absolute() and source:
            path = Path(source).parent / path
        self.spec: HarborDir = read_task_dir(path)
        # what a harness agent (mini-swe-agent, claude-code, codex) is asked: the instruction
        # alone, without PROMPT's words about the ReAct loop's tools
        self.row = {**row, "task": self.spec.instruction.strip()}
        if not self.instance_id:
            self.instance_id = path.name

    # -- environment ---------------------------------------------------------------------
    @property
    def workdir(self) -> str:
        df = self.spec.dockerfile
        return df.workdir if df else str(self.row.get("workdir") or "/app")

    def _image(self) -> tuple[str, dict[str, Any]]:
        """The image a container runs, and the container settings that make it: the task's
        prebuilt one; the Dockerfile's FROM image when the Dockerfile only places files (copied
        at setup); else an image built from environment/ when missing, named by its content."""
        df = self.spec.dockerfile
        env = self.spec.config.environment
        if env.docker_image:
            return env.docker_image, {}
        assert df is not None, "read_task_dir: a task without docker_image has a Dockerfile"
        if df.plain:
            return df.base, {}
        env_dir = self.spec.path / "environment"
        return self._built_image, {"build": str(env_dir), "build_timeout_s": env.build_timeout_sec}

    @functools.cached_property
    def _built_image(self) -> str:
        """The name of the image built from environment/: the task's name and a digest of the
        directory's files (a changed environment is a new image; an unchanged one is reused)."""
        env_dir = self.spec.path / "environment"
        digest = hashlib.sha256()
        for f in sorted(p for p in env_dir.rglob("*") if p.is_file()):
            digest.update(f"{f.relative_to(env_dir)}\0".encode() + f.read_bytes() + b"\0")
        slug = re.sub(r"[^a-z0-9_.-]+", "-", self.spec.name.lower()).strip("-.") or "task"
        return f"localhost/uniagent-harbor-{slug}:{digest.hexdigest()[:12]}"

    def _copies(self) -> list[tuple[Path, str]]:
        """(host source, sandbox destination) of the Dockerfile's COPY/ADD, placed at setup
        (none when an image, prebuilt or built from the Dockerfile, already holds them)."""
        df = self.spec.dockerfile
        if df is None or not df.plain or self.spec.config.environment.docker_image:
            return []
        env_dir = self.spec.path / "environment"
        out = []
        many = len(df.copies) > 1
        for src, dest in df.copies:
            host = (env_dir / src).resolve()
            if not host.is_relative_to(env_dir.resolve()) or not host.exists():
                raise ConfigError(f"{self.instance_id}: Dockerfile COPY {src}: no such file in environment/")
            target = dest if dest.startswith("/") else posixpath.join(df.workdir, dest)
            if host.is_file() and (dest.endswith("/") or dest in (".", "./") or many):
                target = posixpath.join(target, host.name)
            out.append((host, posixpath.normpath(target)))
        return out

    def sandbox_config(self, base: SandboxConfig | None) -> SandboxConfig:
        """The run's sandbox settings completed with the task's environment (module docstring).
        A setting the backend cannot honour is a ConfigError naming it."""
        cfg = parse_config(base)
        kind = type_of(cfg)
        env = self.spec.config.environment
        df = self.spec.dockerfile
        users = [u for u in (self.spec.config.agent.user, self.spec.config.verifier.user) if u]
        limits = cfg.limits.model_copy(
            update={k: v for k, v in {"cpus": env.cpus, "memory_mb": env.memory_mb}.items() if v}
        )
        fields: dict[str, Any] = {"workdir": self.workdir, "limits": limits.model_dump(exclude_unset=False)}
        if df is not None and df.env:
            fields["env"] = {**df.env, **cfg.env}
        # allow_internet = false always holds; true gives network unless the user turned it off
        user_net = getattr(cfg, "network", True) if "network" in cfg.model_fields_set else True
        fields["network"] = bool(env.allow_internet and user_net)
        where = f"{self.instance_id} ({self.spec.path})"
        if kind == "local" and df is not None and df.plain and not env.docker_image:
            if users:
                raise ConfigError(
                    f"{where}: agent.user/verifier.user {users[0]!r}: the local sandbox runs every "
                    "command as one user; run it with --sandbox container"
                )
            if self.workdir == "/":
                raise ConfigError(
                    f"{where}: its Dockerfile sets no WORKDIR; the local sandbox needs one to bind "
                    "its workspace at: add one, or use --sandbox container"
                )
            outside = [
                d for _, d in self._copies() if not (d + "/").startswith(self.workdir.rstrip("/") + "/")
            ]
            if outside:
                raise ConfigError(
                    f"{where}: the Dockerfile copies to {outside[0]}, outside its WORKDIR "
                    f"{self.workdir}; the local sandbox writes only there: use --sandbox container"
                )
            fields["tmpfs"] = sorted({*getattr(cfg, "tmpfs", []), *PRIVATE_DIRS})
            return retarget(cfg, "local", **fields)
        image, build = self._image()
        target = kind if backend(kind).images else "container"
        if target != "container" and build:
            raise ConfigError(
                f"{where}: its Dockerfile must be built ({'; '.join(df.other[:2]) if df else ''}), "
                f"which the {target} backend cannot do here: run it with --sandbox container, or "
                "build it and set environment.docker_image"
            )
        if target == "modal" and users:
            raise ConfigError(f"{where}: agent.user/verifier.user: not supported on modal")
        fields.update(build)
        if "network" not in backend(target).config_class().model_fields and not fields.pop("network"):
            raise ConfigError(f"{where}: allow_internet = false: the {target} backend cannot cut the network")
        return retarget(cfg, target, image=image, **fields)

    def agent_config(self, config: AgentConfig) -> AgentConfig:
        """The task's agent and verifier timeouts on top of the run's (the shorter agent time
        wins; the verifier gets at least the task's time plus room for the upload). `agent.user`
        is refused here: the agents run their commands as the sandbox's user, and running them as
        another silently would grade a different environment (`verify --gold` honours it)."""
        t = self.spec.config
        if t.agent.user:
            raise ConfigError(
                f"{self.instance_id}: agent.user {t.agent.user!r}: uniagent's agents run their "
                "commands as the sandbox's user; remove it to run agents (verify --gold honours it)"
            )
        wall = min(config.wall_time_s or math.inf, t.agent.timeout_sec)
        verifier = max(config.verifier_timeout_s, t.verifier.timeout_sec + 60)
        return config.model_copy(update={"wall_time_s": wall, "verifier_timeout_s": verifier})

    async def setup(self, sandbox: Sandbox) -> None:
        for host, dest in self._copies():
            await sandbox.upload(host, dest)

    # -- the agent's view ----------------------------------------------------------------
    def messages(self) -> list[dict[str, Any]]:
        text = PROMPT.format(instruction=self.spec.instruction.strip(), workdir=self.workdir)
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]

    def tools(self) -> list[str | dict[str, Any]]:
        return ["bash", "str_replace_editor", "submit"]

    # -- grading -------------------------------------------------------------------------
    async def score(self, sandbox: Sandbox | None, result: EpisodeResult) -> Reward:
        if sandbox is None:
            raise SandboxError("harbor tasks are graded in the agent's sandbox")
        return await self.run_verifier(sandbox)

    async def run_verifier(self, sandbox: Sandbox) -> Reward:
        """Harbor's verifier: tests uploaded now, test.sh run, the reward read from its file."""
        v = self.spec.config.verifier
        dirs = f"{TESTS_DIR} {VERIFIER_LOGS}"  # emptied, not removed: a mount point stays
        fresh = f"mkdir -p {dirs} {LOGS_DIR}/agent && find {dirs} -mindepth 1 -delete"
        res = await sandbox.exec(fresh, timeout=60, session="_verify")
        if res.exit_code != 0:
            raise SandboxError(f"cannot prepare {TESTS_DIR} and {VERIFIER_LOGS}: {res.output[-400:]}")
        await sandbox.upload(self.spec.tests, TESTS_DIR)
        if v.user:
            await sandbox.exec(
                f"chown -R {quote(v.user)} {TESTS_DIR} {LOGS_DIR}", timeout=60, session="_verify"
            )
        cmd = as_user(f"bash {TESTS_DIR}/test.sh", v.user)
        res = await sandbox.exec(
            cmd,
            timeout=v.timeout_sec,
            cwd=self.workdir,
            env=v.env or None,
            session="_verify",
            max_output=None,
        )
        if res.timed_out:
            raise SandboxError(f"tests/test.sh ran past verifier.timeout_sec={v.timeout_sec:g}")
        txt = await self._read(f"{VERIFIER_LOGS}/reward.txt", sandbox)
        js = None if txt is not None else await self._read(f"{VERIFIER_LOGS}/reward.json", sandbox)
        try:
            value, named = parse_reward(txt, js)
        except SandboxError as exc:
            raise SandboxError(f"{exc} (test.sh exit {res.exit_code}: {res.output[-600:].strip()})") from None
        details = {"rewards": named, "test_exit_code": res.exit_code, "test_output": res.output[-LOG_TAIL:]}
        return Reward(value, value >= 1.0, details)

    @staticmethod
    async def _read(path: str, sandbox: Sandbox) -> str | None:
        res = await sandbox.exec(f"test -f {path} && echo yes || echo no", timeout=60, session="_verify")
        if res.output.strip() != "yes":
            return None
        return (await sandbox.read_file(path)).decode(errors="replace")

    async def run_solution(self, sandbox: Sandbox) -> None:
        """solution/solve.sh, uploaded to /solution and run as the agent would (its user, its
        time, the solution's env): the oracle."""
        solve = self.spec.solution
        if solve is None:
            raise ConfigError(f"{self.instance_id}: no solution/solve.sh to run as the oracle")
        await sandbox.upload(solve.parent, SOLUTION_DIR)
        t = self.spec.config
        res = await sandbox.exec(
            as_user(f"bash {SOLUTION_DIR}/solve.sh", t.agent.user),
            timeout=t.agent.timeout_sec,
            cwd=self.workdir,
            env=t.solution.env or None,
            session="_oracle",
            max_output=None,
        )
        if res.timed_out:
            raise SandboxError(f"solution/solve.sh ran past agent.timeout_sec={t.agent.timeout_sec:g}")
        await sandbox.exec(f"find {SOLUTION_DIR} -mindepth 1 -delete", timeout=60, session="_oracle")

    async def grade_oracle(self, sandbox: Sandbox) -> Reward:
        """The task's own solution graded by its own verifier (`uniagent verify --gold`)."""
        await self.run_solution(sandbox)
        return await self.run_verifier(sandbox)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "name": self.spec.name, "schema": self.spec.config.schema}
