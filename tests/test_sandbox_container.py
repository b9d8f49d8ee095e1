"""The container backend against real runtimes: docker (a private dockerd when none runs)
and podman, with an image imported from a tiny rootfs built from this machine's own
binaries, so nothing is pulled from a registry.

Every test runs once per runtime that can start here; a runtime that cannot is skipped
with the reason. apptainer is not installable on the test machine (not in Debian 12, and
its releases come from GitHub), so its test skips unless an `apptainer` binary exists.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require, require_one_of
from container_helpers import Runtime, build_rootfs_tar, import_image, open_runtime
from uniagent.errors import SandboxDeadError, SandboxError, SandboxStartError
from uniagent.sandbox import ContainerConfig, container_oci, create
from uniagent.sandbox import container as container_mod
from uniagent.sandbox.apptainer import ApptainerSandbox
from uniagent.sandbox.container import ContainerSandbox
from uniagent.sandbox.container_oci import READ_CP_THRESHOLD, WRITE_CP_THRESHOLD, OciSandbox, reap_leaked

IMAGE = "localhost/uniagent-test:latest"


@pytest.fixture(scope="session")
def rootfs_tar() -> bytes:
    require("ldd", shutil.which("ldd") is not None, "it assembles the test image from host binaries")
    try:
        return build_rootfs_tar()
    except RuntimeError as exc:
        require("the test image's host binaries", False, str(exc))
        raise


RUNTIMES = "a container runtime (docker or podman)"


def _missing(runtime: str, why: str) -> None:
    """Skip this runtime; under CI=true the session fails if neither runtime ran."""
    require_one_of(RUNTIMES, runtime, False, why)


@pytest.fixture(scope="session", params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest, rootfs_tar: bytes) -> Iterator[Runtime]:
    """A working runtime with the test image imported (once per session)."""
    with open_runtime(request.param, _missing) as rt:
        import_image(rt, rootfs_tar, IMAGE, _missing)
        require_one_of(RUNTIMES, rt.name, True, "")
        yield rt
        rt.run("rmi", "-f", IMAGE)


def make(rt: Runtime, **kw: object) -> ContainerSandbox:
    cfg: dict[str, object] = {
        "type": "container",
        "runtime": rt.name,
        "image": IMAGE,
        "pull": "never",
        "start_retries": 0,
        "start_timeout_s": 60,
        **kw,
    }
    sb = create(cfg)
    assert isinstance(sb, ContainerSandbox)
    return sb


# -- tests --------------------------------------------------------------------------------
async def test_start_exec_state_and_clean_stop(runtime: Runtime) -> None:
    sb = make(runtime, env={"GREETING": "hello world"}, workdir="/work/space")
    async with sb:
        assert sb.start_time_s is not None
        assert runtime.exists(sb.name)
        res = await sb.exec("pwd; echo $GREETING")
        assert res.ok and res.output.split("\n")[:2] == ["/work/space", "hello world"]
        await sb.exec("mkdir -p sub && cd sub && export KEEP=42")
        res = await sb.exec("echo $KEEP; pwd")
        assert res.output.split() == ["42", "/work/space/sub"]
        res = await sb.exec("echo $KEEP; pwd", cwd="/tmp", env={"KEEP": "one-off"})
        assert res.output.split() == ["one-off", "/tmp"]
        res = await sb.exec("pwd")  # the one-off cwd did not stick
        assert res.output.strip() == "/work/space/sub"
        res = await sb.exec("echo out; echo err >&2; (exit 3)")
        assert res.exit_code == 3 and "out" in res.output and "err" in res.output
        assert await sb.alive()
        # processes orphaned by exec sessions are reaped by the keeper (PID 1)
        await sb.exec("(sleep 0.2 &); sleep 0.5")
        res = await sb.exec("ps -eo stat= | grep -c '^Z' || true")
        assert res.output.strip() == "0"
        labels = json.loads(runtime.run("inspect", "-f", "{{json .Config.Labels}}", sb.name).stdout)
        assert labels[container_oci.LABEL] == "1"
        assert labels[container_oci.OWNER_LABEL] == f"{socket.gethostname()}:{os.getpid()}"
        name = sb.name
    assert not await sb.alive()
    assert not runtime.exists(name), "the container must be gone after stop"
    assert runtime.run("ps", "-a", "-q", "--filter", f"name={name}").stdout.strip() == ""
    await sb.stop()  # idempotent
    with pytest.raises(SandboxDeadError):
        await sb.exec("true")


async def test_network_is_off_by_default(runtime: Runtime) -> None:
    async with make(runtime) as sb:
        res = await sb.exec("ls /sys/class/net")
        assert res.output.split() == ["lo"]
        res = await sb.exec("timeout 5 bash -c 'exec 3<>/dev/tcp/1.1.1.1/80' 2>&1; echo rc=$?")
        assert "rc=0" not in res.output
        assert "unreachable" in res.output.lower()


def test_run_args_follow_the_config() -> None:
    """What `run` is asked for, without running it (network on cannot be exercised here: the
    test daemon has no bridge)."""
    on = ContainerSandbox(ContainerConfig(image="x", network=True, run_args=["--hostname", "h"]))
    assert isinstance(on, OciSandbox)  # the runtime's own class
    args = on._run_args()
    assert "none" not in args and args[args.index("--hostname") + 1] == "h"
    assert args[args.index("--entrypoint") + 1 : args.index("--entrypoint") + 3] == ["sh", "x"]
    off = ContainerSandbox(
        ContainerConfig(
            image="x", limits={"memory_mb": 100, "pids": 9, "cpus": 0.5, "open_files": 64}, env={"A": "b c"}
        )
    )
    args = off._run_args()
    assert args[args.index("--network") + 1] == "none"
    assert args[args.index("--memory") + 1] == "100m" and args[args.index("--pids-limit") + 1] == "9"
    assert args[args.index("--cpus") + 1] == "0.5" and "nofile=64:64" in args and "A=b c" in args
    assert "--rm" in args
    podman = ContainerSandbox(ContainerConfig(runtime="podman", image="x"))
    assert any(a.startswith("nproc=") for a in podman._run_args())


async def test_limits_are_applied(runtime: Runtime) -> None:
    limits = {
        "memory_mb": 256, "pids": 32, "cpus": 1, "open_files": 256, "file_size_mb": 1, "cpu_time_s": 50,
    }  # fmt: skip
    async with make(runtime, limits=limits) as sb:
        fmt = "{{.HostConfig.Memory}} {{.HostConfig.PidsLimit}} {{.HostConfig.NanoCpus}}"
        assert runtime.run("inspect", "-f", fmt, sb.name).stdout.split() == [
            str(256 << 20), "32", str(10**9),
        ]  # fmt: skip
        res = await sb.exec("ulimit -n; ulimit -f; ulimit -t")
        assert res.output.split() == ["256", "1024", "50"]
        res = await sb.exec(
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"
        )
        assert res.output.strip() == str(256 << 20)
        res = await sb.exec("dd if=/dev/zero of=big bs=1M count=2 2>/dev/null; stat -c %s big")
        assert res.output.strip().splitlines()[-1] == str(1 << 20)  # SIGXFSZ stopped dd at 1 MiB
        # dash reports a failed fork at once (bash would retry for seconds)
        res = await sb.exec("sh -c 'for i in $(seq 40); do sleep 1 & done; wait' 2>&1", timeout=20)
        assert "fork" in res.output.lower()


async def test_timeout_interrupts_and_session_survives(runtime: Runtime) -> None:
    async with make(runtime) as sb:
        await sb.exec("export MARK=still-here; cd /tmp")
        began = time.monotonic()
        res = await sb.exec("(sleep 30; echo never) | cat", timeout=1)
        assert res.timed_out and not res.ok
        assert time.monotonic() - began < 8
        assert "never" not in res.output
        res = await sb.exec("echo $MARK; pwd; ps -eo args | grep -c '[s]leep 30' || true")
        assert res.output.split() == ["still-here", "/tmp", "0"]
        # The whole line stops, through the signals sent from a second `exec` in the container.
        res = await sb.exec("echo before; sleep 30; echo never; touch never", timeout=1)
        assert res.timed_out and res.exit_code == 130 and res.output.startswith("before\n")
        assert "never" not in res.output
        res = await sb.exec("for i in 1 2; do sleep 30; touch never-$i; done", timeout=1)
        assert res.timed_out and res.exit_code == 130
        res = await sb.exec("echo $MARK; ls /tmp | grep -c never || true")
        assert res.output.split() == ["still-here", "0"]


async def test_files_are_binary_safe(runtime: Runtime) -> None:
    small = bytes(range(256)) * 7 + b"\0\n\r\n\xff"
    medium = os.urandom(WRITE_CP_THRESHOLD + 4321)  # written with `cp`, read through the shell
    big = os.urandom(READ_CP_THRESHOLD + 12345)  # `cp` both ways
    async with make(runtime) as sb:
        await sb.write_file("rel/small.bin", small)
        await sb.write_file("/data/deep/big.bin", big, mode=0o750)
        await sb.write_file("/data/medium.bin", medium)
        assert await sb.read_file("/workspace/rel/small.bin") == small
        assert await sb.read_file("/data/deep/big.bin") == big
        assert await sb.read_file("/data/medium.bin") == medium
        res = await sb.exec("stat -c %a /data/deep/big.bin; sha256sum /data/deep/big.bin")
        mode, digest = res.output.split()[:2]
        assert mode == "750" and digest == hashlib.sha256(big).hexdigest()
        await sb.write_file("text.txt", "héllo\n")
        assert await sb.read_text("text.txt") == "héllo\n"
        await sb.exec("ln -s /data/deep/big.bin link.bin")
        assert await sb.read_file("link.bin") == big  # a link is followed on the `cp` path too
        with pytest.raises(SandboxError):
            await sb.read_file("/nope/missing")
        with pytest.raises(SandboxError):
            await sb.read_file("/data")


async def test_upload_and_download_a_directory(runtime: Runtime, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "nested").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "pkg" / "blob.bin").write_bytes(os.urandom(200_000) + b"\0")
    (src / "pkg" / "nested" / "mod.py").write_text("print('hi')\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("pkg/nested/mod.py")
    async with make(runtime) as sb:
        await sb.upload(src, "proj")
        res = await sb.exec("cd proj && ./run.sh && readlink link && ls -d empty && cat link")
        assert res.output.split() == ["ran", "pkg/nested/mod.py", "empty", "print('hi')"]
        await sb.upload(src / "run.sh", "/single/run.sh")  # a single file
        assert (await sb.exec("/single/run.sh")).output.strip() == "ran"

        assert (await sb.exec("echo new > /workspace/proj/pkg/new.txt")).ok
        out = tmp_path / "out"
        await sb.download("proj", out)
        assert (out / "pkg" / "blob.bin").read_bytes() == (src / "pkg" / "blob.bin").read_bytes()
        assert (out / "pkg" / "new.txt").read_text() == "new\n"
        assert os.readlink(out / "link") == "pkg/nested/mod.py"
        assert (out / "run.sh").stat().st_mode & 0o111 and (out / "empty").is_dir()
        await sb.download("proj/pkg/blob.bin", tmp_path / "one" / "blob.bin")
        assert (tmp_path / "one" / "blob.bin").read_bytes() == (src / "pkg" / "blob.bin").read_bytes()
        with pytest.raises(SandboxError):
            await sb.download("/no/such/dir", tmp_path / "x")


async def test_missing_image_is_a_typed_start_error(runtime: Runtime) -> None:
    sb = make(runtime, image="localhost/uniagent-absent:never", pull="never")
    with pytest.raises(SandboxStartError, match="pull is 'never'"):
        await sb.start()
    began = time.monotonic()
    # `.invalid` never resolves, and a failed lookup is not retried inside the CLI
    sb = make(runtime, image="uniagent.invalid/absent:1", pull="missing")
    with pytest.raises(SandboxStartError, match="pull") as info:
        await sb.start()
    assert "no such host" in str(info.value) or "uniagent.invalid" in str(info.value).split("failed:")[1]
    assert time.monotonic() - began < 30
    assert not await sb.alive()


@pytest.mark.parametrize("runtime_name", ["docker", "podman", "apptainer"])
async def test_missing_cli_is_a_typed_start_error(runtime_name: str) -> None:
    sb = create(
        {"type": "container", "runtime": runtime_name, "image": "x", "executable": "/nonexistent/cli"}
    )
    with pytest.raises(SandboxStartError, match="not found"):
        await sb.start()


async def test_apptainer_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The apptainer CLI calls as built, recorded instead of run: apptainer cannot be
    installed on the test machine (see test_apptainer_instance for the real run)."""
    calls: list[tuple[str, ...]] = []

    async def fake_cli(self: ContainerSandbox, *args: str, **kw: object) -> container_mod.CliResult:
        calls.append(args)
        return container_mod.CliResult(0, b'{"instances": []}', "")

    monkeypatch.setattr(ContainerSandbox, "_cli", fake_cli)
    cfg = ContainerConfig(
        runtime="apptainer", image="python:3.11", env={"A": "1"}, limits={"memory_mb": 512, "cpus": 1.5}
    )
    sb = ContainerSandbox(cfg)
    assert isinstance(sb, ApptainerSandbox)
    assert sb._image() == "docker://python:3.11"
    sb._image_ref = sb._image()
    await sb._launch()
    start = calls[-1]
    assert start[:2] == ("instance", "start") and start[-2:] == ("docker://python:3.11", sb.name)
    assert "--containall" in start and start[start.index("--network") + 1] == "none"
    assert start[start.index("--memory") + 1] == "512M" and start[start.index("--pids-limit") + 1] == "512"
    assert start[start.index("--cpus") + 1] == "1.5" and "--env=A=1" in start
    workspace = start[start.index("--bind") + 1].split(":")[0]
    assert Path(workspace).is_dir()
    # Named with its owner's pid, so a kill -9'd run's dir is swept by the next process.
    assert Path(workspace).name.startswith(f"uniagent-ws-{os.getpid()}-"), workspace
    assert "ulimit -n 1024" in sb._preamble() and "ulimit -f 1048576" in sb._preamble()
    assert not await sb._alive()  # an empty instance list
    await sb._stop()
    assert calls[-1] == ("instance", "stop", "--force", sb.name)
    assert not Path(workspace).exists()

    local = ContainerSandbox(ContainerConfig(runtime="apptainer", image=str(tmp_path), pull="never"))
    assert local._image() == str(tmp_path.resolve())
    remote = ContainerSandbox(ContainerConfig(runtime="apptainer", image="docker://x:1", pull="never"))
    with pytest.raises(SandboxStartError, match="pull is 'never'"):
        remote._image()


async def test_wall_clock_limit_stops_the_container(runtime: Runtime) -> None:
    sb = make(runtime, limits={"wall_clock_s": 0.5})
    await sb.start()
    name = sb.name
    assert await sb.alive()
    for _ in range(100):  # alive() turns false when the stop begins; removal follows
        await asyncio.sleep(0.1)
        if not await sb.alive() and not runtime.exists(name):
            break
    assert not await sb.alive()
    assert not runtime.exists(name)
    with pytest.raises(SandboxDeadError):
        await sb.exec("true")


async def test_a_container_removed_underneath_is_dead(runtime: Runtime) -> None:
    async with make(runtime) as sb:
        runtime.run("rm", "-f", sb.name, check=True)
        assert not await sb.alive()
        with pytest.raises(SandboxDeadError):
            # the first command may only see its shell end; the next one finds no container
            for _ in range(2):
                await sb.exec("true")
        with pytest.raises(SandboxDeadError):
            await sb.read_file("/bin/bash")
    # stop() after the container vanished does not raise


async def test_leaked_containers_are_found_and_reaped(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    monkeypatch.setattr(container_oci, "_owner", lambda: f"{socket.gethostname()}:{dead.pid}")
    async with make(runtime) as orphan:
        monkeypatch.undo()
        mine = await make(runtime).__aenter__()
        cid = runtime.run("inspect", "-f", "{{.Id}}", orphan.name).stdout.strip()
        found = await reap_leaked(runtime.name, dry_run=True)
        assert cid in found
        assert await reap_leaked(runtime.name) == found
        assert not runtime.exists(orphan.name)
        assert runtime.exists(mine.name)  # its owner (this process) is alive
        await mine.stop()


def _apptainer() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


@pytest.mark.skipif(
    _apptainer() is None,
    reason="apptainer is not installed; it is not in Debian 12 and its releases come from GitHub, "
    "which the test machine cannot reach",
)
async def test_apptainer_instance(rootfs_tar: bytes, tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    root.mkdir()
    with tarfile.open(fileobj=io.BytesIO(rootfs_tar)) as tar:
        tar.extractall(root, filter="tar")
    sb = create(
        {
            "type": "container", "runtime": "apptainer", "image": str(root), "pull": "never",
            "start_retries": 0, "limits": {"memory_mb": None, "pids": None, "open_files": 200},
        }
    )  # fmt: skip
    async with sb:
        res = await sb.exec("pwd; ulimit -n; ls /sys/class/net")
        assert res.output.split() == ["/workspace", "200", "lo"]
        await sb.write_file("x.bin", b"\0\1\2")
        assert await sb.read_file("x.bin") == b"\0\1\2"
        res = await sb.exec("sleep 30", timeout=1)
        assert res.timed_out
        assert (await sb.exec("echo ok")).output.strip() == "ok"
    assert not await sb.alive()
