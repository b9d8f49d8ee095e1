"""The Modal backend.

A real Modal sandbox needs the SDK and credentials; without them those tests skip and say
why. What runs everywhere: the errors for a missing SDK and missing credentials, importing
uniagent without `modal`, and the `PipeProcess` adapter driven by a real local bash process
through the shared `ShellSession` logic, the same way the backend drives a Modal process.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from uniagent.errors import ConfigError, SandboxError
from uniagent.sandbox import ModalConfig, create, procs
from uniagent.sandbox.modal import ModalSandbox, PipeProcess, _has_credentials
from uniagent.sandbox.shell import ShellSession


# -- the adapter over a real local process --------------------------------------------------
async def spawn_local(argv: list[str]) -> PipeProcess:
    """A local subprocess seen only through PipeProcess's callables, as a Modal process is."""
    p = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert p.stdin and p.stdout
    stdin, stdout = p.stdin, p.stdout

    async def send(data: bytes) -> None:
        stdin.write(data)
        await stdin.drain()

    async def close_stdin() -> None:
        stdin.close()

    async def chunks() -> AsyncIterator[bytes]:
        while chunk := await stdout.read(4096):
            yield chunk

    async def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            p.kill()

    return PipeProcess(
        send=send, close_stdin=close_stdin, chunks=chunks(), wait_exit=p.wait, kill=kill, pid=p.pid
    )


async def signal_tree(session: ShellSession, sig: int) -> None:
    if session.proc is not None and session.proc.pid is not None:
        shell = procs.find_with_arg(session.proc.pid, session.token) or session.proc.pid
        procs.signal_descendants(shell, sig)


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[ShellSession]:
    s = ShellSession(spawn_local, signal_tree, cwd=str(tmp_path), start_timeout_s=20)  # type: ignore[arg-type]
    await s.start()
    yield s
    await s.close()


async def test_adapter_runs_a_shell_session(session: ShellSession, tmp_path: Path) -> None:
    r = await session.run("echo hi; pwd")
    assert (r.exit_code, r.output) == (0, f"hi\n{tmp_path}\n")
    r = await session.run("mkdir -p d && cd d && export FOO='a b' && false")
    assert r.exit_code == 1 and r.cwd == str(tmp_path / "d")
    r = await session.run('echo "$FOO"; printf abc')
    assert r.output == "a b\nabc"
    r = await session.run("head -c 300000 /dev/zero | tr '\\0' x", max_output=None)
    assert len(r.output) == 300000


async def test_adapter_timeout_interrupts_and_session_survives(session: ShellSession) -> None:
    await session.run("export KEEP=1")
    r = await session.run("echo started; sleep 30", timeout=0.5)
    assert r.timed_out and not r.ok and "started" in r.output
    r = await session.run("echo $KEEP")
    assert r.output == "1\n" and session.restarts == 0


async def test_adapter_shell_exit_and_restart(session: ShellSession, tmp_path: Path) -> None:
    await session.run("cd /tmp")
    r = await session.run("exit 7")
    assert r.exit_code == 7 and "shell exited" in r.output
    assert session.proc is not None and session.proc.returncode == 7
    r = await session.run("pwd")
    assert "previous shell ended (exit 7)" in r.output and r.output.endswith("/tmp\n")


async def test_adapter_close_kills_the_process(session: ShellSession) -> None:
    proc = session.proc
    assert proc is not None and proc.pid is not None
    await session.run("sleep 100 &")
    await session.close()
    assert proc.returncode is not None
    assert not procs.alive(proc.pid)


async def test_adapter_communicate_and_kill() -> None:
    p = await spawn_local(["cat"])
    out, err = await p.communicate(b"bytes \x00\xff through\n")
    assert (out, err, p.returncode) == (b"bytes \x00\xff through\n", None, 0)
    p = await spawn_local(["sleep", "60"])
    p.kill()
    assert await asyncio.wait_for(p.wait(), 10) == -9
    assert p.stdin.is_closing()
    with pytest.raises(BrokenPipeError):
        p.stdin.write(b"late")


async def test_adapter_failures_look_like_a_dead_pipe() -> None:
    async def send(data: bytes) -> None:
        raise RuntimeError("connection to the sandbox lost")

    async def nothing() -> None:
        return None

    async def broken_stream() -> AsyncIterator[bytes]:
        yield b"partial"
        raise RuntimeError("stream reset")

    done = asyncio.Event()

    async def wait_exit() -> int | None:
        await done.wait()
        return None

    p = PipeProcess(send=send, close_stdin=nothing, chunks=broken_stream(), wait_exit=wait_exit)
    p.stdin.write(b"echo\0")
    with pytest.raises(BrokenPipeError):
        await p.stdin.drain()
    assert await p.stdout.read() == b"partial"  # the lost stream ends as EOF
    assert p.returncode is None
    done.set()
    assert await p.wait() == -9  # no exit code known: reported as killed


# -- configuration errors -------------------------------------------------------------------
def test_importing_uniagent_does_not_import_modal() -> None:
    code = "import sys, uniagent, uniagent.sandbox, uniagent.sandbox.modal; print('modal' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_missing_sdk_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "modal", None)  # what `import modal` sees when it is not installed
    sb = create({"type": "modal"})
    assert isinstance(sb, ModalSandbox)
    with pytest.raises(ConfigError, match=r"pip install 'uniagent\[modal\]'"):
        await sb.start()


async def test_missing_credentials_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    modal = pytest.importorskip("modal", reason="the Modal SDK is not installed")
    for var in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_TASK_ID", "MODAL_OAUTH_REFRESH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(modal.config, "_user_config", {})  # as if ~/.modal.toml did not exist
    assert not _has_credentials(modal)
    with pytest.raises(ConfigError, match="modal token new") as info:
        await create(ModalConfig()).start()
    assert "MODAL_TOKEN_ID" in str(info.value)
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-x")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-y")
    assert _has_credentials(modal)


# -- a real Modal sandbox (needs the SDK and credentials) -----------------------------------
def _modal_unavailable() -> str | None:
    try:
        import modal
    except ImportError:
        return "the Modal SDK is not installed (pip install 'uniagent[modal]')"
    if not _has_credentials(modal):
        return "no Modal credentials (MODAL_TOKEN_ID/MODAL_TOKEN_SECRET or ~/.modal.toml)"
    return None


@pytest.mark.slow
async def test_real_modal_sandbox(tmp_path: Path) -> None:
    why = _modal_unavailable()
    if why:
        pytest.skip(why)
    async with create({"type": "modal", "image": "python:3.11-slim", "start_retries": 0}) as sb:
        r = await sb.exec("cd /tmp && export X=1; echo hi")
        assert r.output == "hi\n" and r.cwd == "/tmp"
        assert (await sb.exec("echo $X; pwd")).output == "1\n/tmp\n"
        r = await sb.exec("echo go; sleep 60", timeout=2)
        assert r.timed_out and "go" in r.output
        assert (await sb.exec("echo $X")).output == "1\n"
        data = bytes(range(256)) * 50
        await sb.write_file("/workspace/b.bin", data, mode=0o700)
        assert await sb.read_file("b.bin") == data
        with pytest.raises(SandboxError):
            await sb.read_file("/nope")
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "f.txt").write_text("f")
        await sb.upload(tmp_path / "d", "/workspace/up")
        await sb.download("/workspace/up", tmp_path / "back")
        assert (tmp_path / "back" / "f.txt").read_text() == "f"
        r = await sb.exec(
            "python -c 'import urllib.request as u; u.urlopen(\"http://example.com\", timeout=5)'"
        )
        assert r.exit_code != 0  # network is blocked by default
    assert not await sb.alive()
