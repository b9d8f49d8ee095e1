"""Persistent shell sessions, on the local (bubblewrap) and host backends."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conftest import require
from uniagent import sandbox
from uniagent.errors import ConfigError
from uniagent.sandbox.output import ClippedBuffer, strip_ansi

BACKENDS = ["local", "host"]


@pytest.fixture(params=BACKENDS)
async def sb(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[sandbox.Sandbox]:
    if request.param == "local":
        require("bubblewrap", shutil.which("bwrap") is not None, "apt-get install bubblewrap")
        cfg = {"type": "local", "workspace": str(tmp_path)}
    else:
        cfg = {"type": "host", "workdir": str(tmp_path), "i_understand_there_is_no_isolation": True}
    async with sandbox.create(cfg) as box:
        yield box


async def test_state_persists_and_exit_codes(sb: sandbox.Sandbox) -> None:
    r = await sb.exec("mkdir -p d && cd d && export FOO='a b' && false")
    assert r.exit_code == 1 and r.cwd and r.cwd.endswith("/d")
    r = await sb.exec('echo "$FOO"; basename "$PWD"')
    assert r.output == "a b\nd\n" and r.exit_code == 0
    r = await sb.exec("(exit 42)")
    assert r.exit_code == 42 and not r.ok
    r = await sb.exec("declare -A MAP=([k]=v)\nno_such_command_ua")
    assert r.output == "bash: line 2: no_such_command_ua: command not found\n", "the shell's own words"
    r = await sb.exec("echo 'open")
    assert r.exit_code == 2 and r.output.startswith("bash: eval: line 1: unexpected EOF"), r.output
    assert (await sb.exec('echo "${MAP[k]}"')).output == "v\n", "declare stays global"
    r = await sb.exec("return 3; echo no")
    assert (r.exit_code, r.output) == (3, "")
    assert (await sb.exec('echo "$FOO"')).output == "a b\n"


async def test_one_off_cwd_and_env_do_not_persist(sb: sandbox.Sandbox) -> None:
    r = await sb.exec("pwd; echo $ONE", cwd="/tmp", env={"ONE": "1"})
    assert r.output == "/tmp\n1\n"
    r = await sb.exec("pwd; echo ${ONE:-unset}")
    assert r.output.splitlines() == [sb.workdir, "unset"]
    r = await sb.exec("true", cwd="/does/not/exist")
    assert r.exit_code != 0 and "No such file" in r.output


async def test_stdin_is_closed(sb: sandbox.Sandbox) -> None:
    t0 = time.monotonic()
    r = await sb.exec("cat; read x; echo rc=$?; python3 -c 'input()' 2>&1 | tail -1", timeout=10)
    assert time.monotonic() - t0 < 5 and not r.timed_out
    assert "rc=1" in r.output and "EOFError" in r.output


async def test_output_exact_ansi_stripped_and_clipped(sb: sandbox.Sandbox) -> None:
    assert (await sb.exec("printf abc")).output == "abc"
    assert (await sb.exec("printf 'abc\\n\\n'")).output == "abc\n\n"
    assert (await sb.exec("printf '\\033[1;31mred\\033[0m\\n'")).output == "red\n"
    r = await sb.exec("seq 1 200000", max_output=1000)
    assert r.clipped and r.output.startswith("1\n2\n") and r.output.endswith("199999\n200000\n")
    assert "bytes of output cut here" in r.output and len(r.output) < 1300
    r = await sb.exec("echo; echo __UA_0000 0 /fake; echo after")
    assert r.output == "\n__UA_0000 0 /fake\nafter\n", "a look-alike marker is just output"
    r = await sb.exec("head -c 5000000 /dev/zero | tr '\\0' x | wc -c", max_output=None)
    assert r.output.strip() == "5000000"


async def test_timeouts_builtin_loops_and_exits(sb: sandbox.Sandbox) -> None:
    await sb.exec("export KEEP=yes")
    # SIGINT comes first, so a program can clean up (bash, not python3: on a busy machine a
    # pyenv shim can still be starting when the signal comes, and dies without a word).
    r = await sb.exec("""bash -c 'trap "echo got-SIGINT; exit 130" INT; sleep 60; :'""", timeout=0.5)
    assert r.timed_out and "got-SIGINT" in r.output
    assert (await sb.exec("echo $KEEP")).output == "yes\n", "the session survives an interrupt"
    r = await sb.exec("while true; do :; done; echo went-on", timeout=0.3)
    assert r.timed_out and r.exit_code == 130 and "went-on" not in r.output
    assert (await sb.exec("echo $KEEP")).output == "yes\n", "a builtin loop stops, the shell stays"
    # A shell that ignores the signal that stops a line stays in its loop: it is restarted.
    r = await sb.exec("trap '' USR1; while :; do :; done", timeout=0.3)
    assert r.timed_out and "restarted" in r.output
    r = await sb.exec("echo ${KEEP:-gone}")
    assert "new shell" in r.output and r.output.endswith("gone\n")
    r = await sb.exec("exit 7")
    assert r.exit_code == 7 and "shell exited" in r.output
    assert (await sb.exec("echo back")).output.endswith("back\n")


STOPPED_LINES = [
    "echo before; sleep 5; echo after; touch after",
    "for i in 1 2 3; do sleep 2; echo $i; touch for-$i; done",
    "sleep 5 && touch and",
    "sleep 5 || touch or",
    "f() { sleep 5; echo in-f; touch in-f; }; f; echo after-f; touch after-f",
]


async def test_timeout_stops_the_whole_command_line(sb: sandbox.Sandbox) -> None:
    """Nothing of a timed-out line runs after the timeout (not just the running process),
    and what was set before it stays. One session per line, all at once."""
    runs = [(f"s{i}", line) for i, line in enumerate(STOPPED_LINES)]
    for name, _ in runs:
        # `set -u` too: the driver's own variables must all be set
        await sb.exec("set -u; mkdir -p d && cd d && export KEEP=yes && declare -A MAP=([k]=v)", session=name)
    results = await asyncio.gather(*(sb.exec(line, timeout=1, session=name) for name, line in runs))
    for (name, line), r in zip(runs, results, strict=True):
        assert r.timed_out and r.exit_code == 130 and "timed out after 1s" in r.output, (name, line)
        assert r.output.startswith("before\n" if "before" in line else "\n["), (name, line, r.output)
    await asyncio.sleep(6)  # past every `sleep` above: a line that went on would be done by now
    for name, line in runs:
        r = await sb.exec('echo "$KEEP ${MAP[k]}"; basename "$PWD"; ls', session=name)
        assert r.output == "yes v\nd\n", (name, line, r.output)


async def test_sessions_are_independent_and_serialised(sb: sandbox.Sandbox) -> None:
    await sb.exec("cd /tmp; export WHO=default")
    await sb.exec("export WHO=second", session="second")
    assert (await sb.exec("echo $WHO; pwd", session="second")).output == f"second\n{sb.workdir}\n"
    assert (await sb.exec("echo $WHO; pwd")).output == "default\n/tmp\n"
    outs = await asyncio.gather(*(sb.exec(f"sleep 0.0{i % 3}; echo {i}") for i in range(20)))
    assert [o.output.strip() for o in outs] == [str(i) for i in range(20)]


async def test_interrupt_from_another_task(sb: sandbox.Sandbox) -> None:
    sess = await sb.session()
    task = asyncio.create_task(sb.exec("sleep 30; echo done-$?", timeout=20))
    await asyncio.sleep(0.3)
    await sess.interrupt()
    r = await asyncio.wait_for(task, 5)
    assert not r.timed_out and r.exit_code == 130 and "done-" not in r.output, "as Ctrl-C at a prompt"
    # A stop that reaches an idle shell, or one whose line ended just then, stops nothing later.
    await sess.interrupt()
    await asyncio.sleep(0.1)
    for t in (None, 0.05, 0.1, 0.15):
        if t is not None:
            await sb.exec("sleep 0.1; echo x", timeout=t)
        r = await sb.exec("echo one; echo two")
        assert (r.exit_code, r.output) == (0, "one\ntwo\n"), t


async def test_nul_byte_is_refused(sb: sandbox.Sandbox) -> None:
    r = await sb.exec("echo a\0b")
    assert r.exit_code == 2 and "NUL" in r.output


async def test_host_needs_explicit_opt_in(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="i_understand_there_is_no_isolation"):
        sandbox.create({"type": "host", "workdir": str(tmp_path)})


def test_clipped_buffer_keeps_head_and_tail() -> None:
    buf = ClippedBuffer(10)
    for ch in b"abcdefghijklmnopqrstuvwxyz":
        buf.feed(bytes([ch]))
    assert buf.head == b"abcde" and buf.tail == b"vwxyz" and buf.dropped == 16
    assert strip_ansi("\x1b]0;title\x07a\x1b[2Kb\r\n") == "ab\n"


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^sandbox\.limits\.pids: "):
        sandbox.parse_config({"limits": {"pids": 1}})
    with pytest.raises(ConfigError, match="mapping"):
        sandbox.parse_config("local")
