"""The user's sandbox settings reach the sandbox a task runs in, or fail loudly.

A row with an image runs in a container (or the user's modal / SWE-ReX-in-a-container), and
everything the user set that the backend supports carries over; what it cannot honour is a
one-line ConfigError naming the key. Also: one start slot is enough for a SWE-ReX server that
starts its own inner sandbox, and the slots work on any event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path
from typing import Any

import pytest

from uniagent import sandbox as sandboxes
from uniagent.errors import ConfigError
from uniagent.sandbox import ContainerConfig, ModalConfig, SweRexConfig, parse_config
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import as_written, retarget
from uniagent.tasks import load_tasks
from uniagent.tasks.r2e_gym import R2EGymTask
from uniagent.tasks.swe import SweTask
from uniagent.tasks.swe_rebench import SweRebenchTask

FIXTURES = Path(__file__).parent / "fixtures"
IMAGE = "ghcr.io/example/sweb.eval.calc-001:latest"
USER = {
    "type": "local",
    "network": True,
    "env": {"PIP_INDEX_URL": "http://mirror.local/simple"},
    "limits": {"memory_mb": 2048, "pids": 256, "cpus": 1.5, "wall_clock_s": 900},
    "start_timeout_s": 600,
    "start_retries": 5,
    "max_output_chars": 5000,
}
KEPT = {k: v for k, v in USER.items() if k != "type"}


def image_row(**over: Any) -> dict[str, Any]:
    row = {
        "instance_id": "calc-001",
        "problem_statement": "add(2, 3) returns -1.",
        "image": IMAGE,
        "test_cmd": "pytest -rA",
    }
    return {**row, **over}


def test_an_image_row_keeps_the_users_settings() -> None:
    cfg = SweTask(image_row()).sandbox_config(USER)
    assert isinstance(cfg, ContainerConfig), "the task's sandbox is the backend's typed config"
    assert as_written(cfg) == {**KEPT, "type": "container", "image": IMAGE, "workdir": "/testbed"}
    box = sandboxes.create(cfg)
    assert isinstance(box.config, ContainerConfig) and box.config.network
    assert box.config.limits.memory_mb == 2048 and box.config.limits.cpus == 1.5
    assert box.config.limits.wall_clock_s == 900 and box.config.start_timeout_s == 600
    assert box.config.env == USER["env"] and box.config.max_output_chars == 5000
    assert box.config is cfg, "created from the typed config as is, not parsed again"
    # A config object works as a dict does: only what the user set counts as set.
    assert as_written(SweTask(image_row(workdir="/src")).sandbox_config(parse_config(USER))) == {
        **KEPT,
        "type": "container",
        "image": IMAGE,
        "workdir": "/src",
    }


def test_the_image_comes_from_the_row_and_the_runtime_from_the_user() -> None:
    user = {
        "type": "container",
        "runtime": "podman",
        "image": "mine:1",
        "pull": "never",
        "limits": {"pids": 99},
    }
    cfg = SweTask(image_row()).sandbox_config(user)
    assert as_written(cfg) == {**user, "image": IMAGE, "workdir": "/testbed"}
    modal = SweTask(image_row()).sandbox_config({"type": "modal", "cpu": 2.0, "timeout_s": 120})
    assert isinstance(modal, ModalConfig) and modal.image == IMAGE and modal.cpu == 2.0
    host = {"type": "host", "i_understand_there_is_no_isolation": True, "env": {"A": "1"}}
    assert as_written(SweTask(image_row()).sandbox_config(host)) == {
        "type": "container",
        "env": {"A": "1"},
        "image": IMAGE,
        "workdir": "/testbed",
    }, "a container needs no consent to run without isolation"
    no_image = SweTask(image_row(image=None, repo_dir="x")).sandbox_config(USER)
    assert as_written(no_image) == USER, "no image: as given"


def test_every_swe_family_keeps_the_settings() -> None:
    """SWE-rebench and R2E-Gym rows inherit SweTask.sandbox_config: their published rows too."""
    rebench = [t for t in load_tasks(str(FIXTURES / "swe_rebench_rows.jsonl")) if t.row.get("image")]
    r2e = [t for t in load_tasks(str(FIXTURES / "r2e_gym_rows.jsonl")) if t.row.get("image")]
    assert {type(t) for t in rebench + r2e} == {SweRebenchTask, R2EGymTask}
    for t in rebench + r2e:
        cfg = as_written(t.sandbox_config(USER))
        assert cfg == {**KEPT, "type": "container", "image": t.row["image"], "workdir": t.row["workdir"]}


@pytest.mark.parametrize(
    ("user", "key"),
    [
        ({"type": "local", "rootfs": "/srv/rootfs"}, "rootfs"),
        ({"type": "local", "ro_binds": ["/data"]}, "ro_binds"),
        ({"type": "local", "env_allowlist": ["HOME"]}, "env_allowlist"),
        ({"type": "local", "keep_workspace": True}, "keep_workspace"),
    ],
)
def test_a_setting_the_container_cannot_honour_is_named(user: dict[str, Any], key: str) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"^calc-001: sandbox\.{key}: this task runs in a container sandbox for image {IMAGE}",
    ):
        SweTask(image_row()).sandbox_config(user)


def test_swerex_runs_an_image_only_in_a_container_it_starts() -> None:
    with pytest.raises(ConfigError, match=r"sandbox\.url: this task runs in image"):
        SweTask(image_row()).sandbox_config({"type": "swerex", "url": "http://10.0.0.5", "port": 8000})
    with pytest.raises(ConfigError, match=r"sandbox\.inner: .*inside a container"):
        SweTask(image_row()).sandbox_config({"type": "swerex"})
    inner = {"type": "container", "network": True, "run_args": ["--network", "host"]}
    cfg = SweTask(image_row()).sandbox_config({"type": "swerex", "inner": inner, "limits": {"pids": 64}})
    assert isinstance(cfg, SweRexConfig) and as_written(cfg)["limits"] == {"pids": 64}
    assert (
        as_written(cfg.inner) == {**inner, "image": IMAGE, "workdir": "/testbed"}
        and cfg.workdir == "/testbed"
    )


def test_retarget_validates_through_the_union() -> None:
    with pytest.raises(ConfigError, match=r"sandbox\.limits\.memory_mb"):
        retarget({"type": "local", "limits": {"memory_mb": 1}}, "container", image=IMAGE)
    with pytest.raises(ConfigError, match="unknown sandbox type 'vm'"):
        retarget(None, "vm")
    assert as_written(retarget(None, "container", image=IMAGE)) == {"type": "container", "image": IMAGE}


def test_the_removed_sandbox_timeout_names_its_replacement() -> None:
    with pytest.raises(ConfigError, match=r"sandbox\.default_timeout_s .*agent\.command_timeout_s"):
        parse_config({"type": "local", "default_timeout_s": 30})


# -- start slots --------------------------------------------------------------------------
HOST = {"type": "host", "i_understand_there_is_no_isolation": True}


@pytest.fixture
def one_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Sandbox, "start_slots", None)  # restored after the test
    Sandbox.set_start_concurrency(1)


async def test_swerex_starting_its_inner_sandbox_needs_one_slot(one_slot: None, tmp_path) -> None:
    """A real swerex-remote launched inside a host sandbox, with runner.sandbox_start_concurrency 1.
    Before, the outer start held the only slot while its inner sandbox waited for one: stuck
    until the start timeout."""
    boxes = [
        sandboxes.create(
            {
                "type": "swerex",
                "start_timeout_s": 30,
                "start_retries": 0,
                "inner": {**HOST, "workdir": str(tmp_path / f"w{i}")},
            }
        )
        for i in range(2)
    ]
    for i in range(2):
        (tmp_path / f"w{i}").mkdir()
    began = time.perf_counter()
    try:
        await asyncio.gather(*(b.start() for b in boxes))
        outs = [(await b.exec("echo up")).output for b in boxes]
    finally:
        await asyncio.gather(*(b.stop() for b in boxes))
    assert outs == ["up\n", "up\n"]
    assert time.perf_counter() - began < 25


def test_start_slots_work_on_every_event_loop(one_slot: None, tmp_path) -> None:
    """One process, several loops (tests, trainer threads): a semaphore bound to the first loop
    used to fail every contended start on the next one."""

    async def contended_starts() -> list[str]:
        boxes = [sandboxes.create({**HOST, "workdir": str(tmp_path)}) for _ in range(3)]
        try:
            await asyncio.gather(*(b.start() for b in boxes))
            return [(await b.exec("echo ok")).output for b in boxes]
        finally:
            await asyncio.gather(*(b.stop() for b in boxes))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        for _ in range(2):
            assert pool.submit(asyncio.run, contended_starts()).result(60) == ["ok\n"] * 3


def test_limits_are_rendered_once_for_every_backend() -> None:
    """bwrap's prlimit/setrlimit, docker's --ulimit, apptainer's and Modal's `ulimit` lines and the
    cgroup flags all come from `Limits`, so the backends cannot drift apart."""
    from uniagent.sandbox.settings import Limits

    lim = Limits(memory_mb=100, pids=9, cpus=1.5, open_files=64, file_size_mb=2, cpu_time_s=5)
    assert lim.rlimits() == {"nofile": 64, "fsize": 2 << 20, "cpu": 5}
    assert lim.rlimits(address_space=True)["as"] == 100 << 20
    assert lim.ulimit_lines() == ["ulimit -n 64", "ulimit -f 2048", "ulimit -t 5"]
    assert lim.cgroup_flags(mb_suffix="M") == ["--memory", "100M", "--pids-limit", "9", "--cpus", "1.5"]
    assert lim.cgroup_flags(no_swap=True)[:4] == ["--memory", "100m", "--memory-swap", "100m"]
    bare = Limits(memory_mb=None, pids=None, open_files=None, file_size_mb=None)
    assert bare.rlimits(address_space=True) == {} and bare.ulimit_lines() == [] and bare.cgroup_flags() == []
