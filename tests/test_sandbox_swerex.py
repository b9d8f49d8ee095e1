"""The SWE-ReX backend against a real `swerex-remote` server on 127.0.0.1.

Most tests use a server this module starts (remote mode: URL + token). The "started" mode
tests let the backend launch its own server inside a host sandbox and, where bubblewrap
works, inside the default local sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require
from uniagent.errors import ConfigError, SandboxDeadError, SandboxError
from uniagent.sandbox import SweRexConfig, create
from uniagent.sandbox.swerex import SweRexSandbox, free_port


def _alive(port: int, token: str) -> bool:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/is_alive", headers={"X-API-Key": token})
    try:
        with urllib.request.urlopen(req, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


SERVER_CMD = [sys.executable, "-m", "swerex.server", "--host", "127.0.0.1"]


class Server:
    """A real swerex-remote process on a free loopback port."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.token = "tok-" + secrets.token_hex(12)
        self.log = open(tmp / f"swerex-{self.port}.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [*SERVER_CMD, "--port", str(self.port), "--auth-token", self.token],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not _alive(self.port, self.token):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("swerex-remote did not start")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("swerex"))
    yield srv
    srv.stop()


def remote_config(srv: Server, **kw: object) -> SweRexConfig:
    base: dict[str, object] = {"url": srv.url, "auth_token": srv.token, "workdir": "/tmp", "start_retries": 0}
    return SweRexConfig(**{**base, **kw})


@pytest.fixture
async def box(server: Server):
    sb = create(remote_config(server))
    async with sb:
        yield sb


async def test_exec_output_and_exit_codes(box: SweRexSandbox) -> None:
    r = await box.exec("echo hi")
    assert (r.exit_code, r.output, r.timed_out) == (0, "hi\n", False)
    assert (await box.exec("echo -n hi")).output == "hi"
    assert (await box.exec("false")).exit_code == 1
    assert (await box.exec("(exit 42)")).exit_code == 42
    r = await box.exec("echo out; echo err >&2")
    assert r.output == "out\nerr\n"
    r = await box.exec("echo (")  # a syntax error is bash's, as in any shell
    assert r.exit_code == 2 and "syntax error" in r.output


async def test_command_text_survives_the_pty(box: SweRexSandbox) -> None:
    """Tabs, quotes, `!`, non-ASCII, heredocs and long lines reach bash byte for byte."""
    r = await box.exec("cat <<'EOF'\n\tindented 'q' \"dq\" $HOME !! \\ é\nEOF")
    assert r.output == "\tindented 'q' \"dq\" $HOME !! \\ é\n"
    long = "x" * 20_000
    assert (await box.exec(f"echo {long} | wc -c")).output.strip() == "20001"
    r = await box.exec("printf 'a\\0b'")
    assert r.exit_code == 0
    r = await box.exec("echo a\0b")
    assert r.exit_code == 2 and "NUL" in r.output


async def test_cwd_and_env_persist(box: SweRexSandbox) -> None:
    r = await box.exec("mkdir -p /tmp/ua_rex_dir && cd /tmp/ua_rex_dir && export UA_FOO=bar")
    assert r.ok and r.cwd == "/tmp/ua_rex_dir"
    r = await box.exec("pwd; echo $UA_FOO")
    assert r.output == "/tmp/ua_rex_dir\nbar\n"
    # one-off cwd/env leave the session alone
    r = await box.exec("pwd; echo $UA_ONE", cwd="/", env={"UA_ONE": "1"})
    assert r.output == "/\n1\n"
    r = await box.exec("pwd; echo ${UA_ONE:-unset}")
    assert r.output == "/tmp/ua_rex_dir\nunset\n"


async def test_config_env_and_pager(server: Server) -> None:
    async with create(remote_config(server, env={"UA_CFG": "v w"})) as sb:
        r = await sb.exec("echo $UA_CFG; echo $PAGER; pwd")
        assert r.output == "v w\ncat\n/tmp\n"


async def test_workdir_is_created_and_used(server: Server, tmp_path: Path) -> None:
    wd = tmp_path / "new" / "wd"
    async with create(remote_config(server, workdir=str(wd))) as sb:
        assert (await sb.exec("pwd")).output == f"{wd}\n"
        await sb.write_file("rel.txt", "r")
        assert (wd / "rel.txt").read_text() == "r"


async def test_timeout_interrupts_and_session_survives(box: SweRexSandbox) -> None:
    await box.exec("cd /tmp && export KEEP=1")
    t0 = time.perf_counter()
    r = await box.exec("echo started; sleep 30; echo never", timeout=1)
    assert r.timed_out and r.exit_code is None and not r.ok
    assert "started" in r.output and "never" not in r.output and "timed out after 1s" in r.output
    assert time.perf_counter() - t0 < 15
    r = await box.exec("echo $KEEP; pwd")
    assert r.output == "1\n/tmp\n"
    assert (await box.session()).restarts == 0


async def test_shell_exit_restarts_in_last_cwd(box: SweRexSandbox) -> None:
    await box.exec("cd /tmp && export GONE=1")
    r = await box.exec("exit 3")
    assert r.exit_code in (3, None) and "shell exited" in r.output
    r = await box.exec("pwd; echo ${GONE:-unset}")
    assert r.ok and "previous shell ended" in r.output
    assert r.output.endswith("/tmp\nunset\n")
    assert (await box.session()).restarts == 1


async def test_two_sessions_are_independent(box: SweRexSandbox) -> None:
    await box.exec("cd / && export WHO=a", session="a")
    await box.exec("cd /tmp && export WHO=b", session="b")
    assert (await box.exec("pwd; echo $WHO", session="a")).output == "/\na\n"
    assert (await box.exec("pwd; echo $WHO", session="b")).output == "/tmp\nb\n"
    assert (await box.exec("echo ${WHO:-none}")).output == "none\n"


async def test_output_is_clipped(server: Server) -> None:
    async with create(remote_config(server, max_output_chars=1000)) as sb:
        r = await sb.exec("seq 1 20000")
        assert r.clipped and r.ok and len(r.output) < 1500
        assert r.output.startswith("1\n2\n") and r.output.endswith("20000\n") and "cut here" in r.output
        r = await sb.exec("seq 1 20000", max_output=None)
        assert not r.clipped and r.output.count("\n") == 20000


async def test_binary_file_round_trip(box: SweRexSandbox, tmp_path: Path) -> None:
    data = bytes(range(256)) * 300 + b"\r\n\0\xff"
    await box.write_file("/tmp/ua_rex_files/bin.dat", data)
    assert await box.read_file("/tmp/ua_rex_files/bin.dat") == data
    await box.write_file("rel.txt", "héllo\n", mode=0o750)  # relative to workdir (/tmp)
    assert await box.read_text("/tmp/rel.txt") == "héllo\n"
    assert (await box.exec("stat -c %a /tmp/rel.txt")).output.strip() == "750"
    await box.write_file("/tmp/ua_rex_files/empty", b"")
    assert await box.read_file("/tmp/ua_rex_files/empty") == b""
    with pytest.raises(SandboxError, match="No such file"):
        await box.read_file("/tmp/ua_rex_files/missing")


async def test_directory_upload_download(box: SweRexSandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("print('a')\n")
    (src / "pkg" / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("pkg/a.py")
    await box.upload(src, "/tmp/ua_rex_up")
    r = await box.exec("cd /tmp/ua_rex_up && ./run.sh && cat link && test -L link && echo islink")
    assert r.output == "ran\nprint('a')\nislink\n"
    await box.exec("echo new > /tmp/ua_rex_up/pkg/new.txt")

    out = tmp_path / "back"
    await box.download("/tmp/ua_rex_up", out)
    assert (out / "pkg" / "sub" / "b.bin").read_bytes() == bytes(range(256))
    assert (out / "pkg" / "new.txt").read_text() == "new\n"
    assert os.access(out / "run.sh", os.X_OK)
    await box.download("/tmp/ua_rex_up/pkg/a.py", tmp_path / "one" / "a.py")
    assert (tmp_path / "one" / "a.py").read_text() == "print('a')\n"
    one = tmp_path / "single.txt"
    one.write_text("x")
    await box.upload(one, "/tmp/ua_rex_single/s.txt")
    assert await box.read_text("/tmp/ua_rex_single/s.txt") == "x"
    with pytest.raises(SandboxError, match="no such file"):
        await box.download("/tmp/ua_rex_nothing_here", tmp_path / "x")


async def test_wrong_token_is_a_config_error(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    bad = "bad-" + secrets.token_hex(8)
    sb = create(remote_config(server, auth_token=bad))
    with pytest.raises(ConfigError, match="rejected the token") as info:
        await sb.start()
    assert "auth_token" in str(info.value)
    assert bad not in str(info.value) and bad not in repr(info.value)
    assert bad not in caplog.text and server.token not in caplog.text
    assert not await sb.alive()


async def test_unreachable_server_fails_to_start() -> None:
    sb = create({"type": "swerex", "url": f"127.0.0.1:{free_port()}", "start_retries": 0, "auth_token": "x"})
    with pytest.raises(SandboxError, match="not reachable"):
        await sb.start()


async def test_server_killed_mid_episode_is_dead(tmp_path: Path) -> None:
    srv = Server(tmp_path)
    try:
        async with create(remote_config(srv)) as sb:
            assert (await sb.exec("echo up")).output == "up\n"
            os.killpg(srv.proc.pid, signal.SIGKILL)
            srv.proc.wait(10)
            with pytest.raises(SandboxDeadError, match="died"):
                await sb.exec("echo again")
            assert not await sb.alive()
            with pytest.raises(SandboxDeadError):
                await sb.read_file("/etc/hostname")
    finally:
        srv.stop()


async def test_remote_stop_closes_only_own_sessions(server: Server) -> None:
    async with create(remote_config(server)) as a, create(remote_config(server)) as b:
        await a.exec("export MINE=a")
        await b.exec("export MINE=b")
        await a.stop()
        assert (await b.exec("echo $MINE")).output == "b\n"
    with pytest.raises(SandboxDeadError):
        await a.exec("true")


HOST_INNER = {"type": "host", "i_understand_there_is_no_isolation": True}


async def test_started_mode_in_host_sandbox(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """uniagent launches swerex-remote itself; the token is random and never shows up anywhere."""
    caplog.set_level(logging.DEBUG)
    ws = tmp_path / "ws"
    sb = create({"type": "swerex", "inner": {**HOST_INNER, "workdir": str(ws)}})
    assert isinstance(sb, SweRexSandbox)
    async with sb:
        token = sb._token
        assert token and len(token) >= 20
        assert sb.url and sb.url.startswith("http://127.0.0.1:")
        port = int(sb.url.rsplit(":", 1)[1])
        r = await sb.exec("pwd; echo hi > f.txt; env | grep -c -- " + token[:12] + " || true")
        assert r.output == f"{ws}\nhi\n0\n" or r.output == f"{ws}\n0\n"
        assert (ws / "f.txt").read_text() == "hi\n"
        r = await sb.exec("sleep 20", timeout=0.5)
        assert r.timed_out
        r = await sb.exec("ps -eo args | grep -c -- " + token[:12] + " || true")
        assert r.output.strip() == "1"  # only the grep itself: the token is in no process's argv
        await sb.write_file("b.bin", bytes(range(256)))
        assert (ws / "b.bin").read_bytes() == bytes(range(256))
        for text in (repr(sb), str(sb), repr(sb.config), sb.config.model_dump_json()):
            assert token not in text
        log_path = Path(sb._server.log_path or "")
        assert log_path.is_file()  # a host inner's /tmp is the host's
    assert not _alive(port, token), "the server must die with the sandbox"
    assert not log_path.exists(), "the server's log must go with the sandbox"
    assert _processes_in(ws) == [], "the server and its shells must die with the sandbox"
    assert token not in caplog.text


def _processes_in(cwd: Path) -> list[int]:
    """Processes whose working directory is `cwd` (the server and the shells it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == str(cwd):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_token_from_config_never_leaks(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = remote_config(server)
    sb = create(cfg)
    async with sb:
        await sb.exec("sleep 5", timeout=0.3)
        await sb.exec("exit 1")
        with pytest.raises(SandboxError):
            await sb.read_file("/nonexistent/file")
        for text in (repr(sb), str(sb), repr(sb.config), sb.config.model_dump_json()):
            assert server.token not in text
    assert server.token not in caplog.text


async def test_inner_without_network_is_rejected() -> None:
    with pytest.raises(ConfigError, match="network: true"):
        await create({"type": "swerex", "inner": {"type": "local"}}).start()


def _local_works() -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed"
    try:
        import uniagent.sandbox.local  # noqa: F401
    except ImportError as exc:
        return f"the local backend is not available: {exc}"
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], capture_output=True)
    return None if probe.returncode == 0 else f"bwrap cannot run here: {probe.stderr.decode()[:200]}"


async def test_started_mode_in_default_local_sandbox() -> None:
    why = _local_works()
    require("a working local sandbox", why is None, why or "")
    sb = create({"type": "swerex", "start_retries": 0})
    async with sb:
        port = int((sb.url or "").rsplit(":", 1)[1])
        token = sb._token or ""
        r = await sb.exec("pwd; echo hi")
        assert r.output == "/workspace\nhi\n"
        await sb.write_file("x/y.bin", b"\x00\x01")
        assert await sb.read_file("/workspace/x/y.bin") == b"\x00\x01"
        r = await sb.exec("touch /usr/ua_should_fail 2>&1; echo rc=$?")
        assert "rc=1" in r.output
    await asyncio.sleep(0.2)
    assert not _alive(port, token)


async def test_a_token_starting_with_a_dash_starts_the_server() -> None:
    """The server got its token as `--auth-token TOKEN`; argparse read a token that begins with
    '-' (1 in 64 of secrets.token_urlsafe) as an option and swerex-remote exited."""
    why = _local_works()
    require("a working local sandbox", why is None, why or "")
    async with create({"type": "swerex", "start_retries": 0, "auth_token": "-starts-with-a-dash"}) as sb:
        assert (await sb.exec("echo hi")).output == "hi\n"
