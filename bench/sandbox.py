"""Round-trip latency of one `echo hi` through a persistent shell: uniagent vs SWE-ReX.

What is timed (``time.perf_counter`` around each call, after a few warm-up commands):

* ``uniagent_local`` -- ``Sandbox.exec("echo hi")`` in the default session of a uniagent ``local``
  sandbox (bubblewrap; the ``host`` backend when ``uniagent.sandbox.local`` is missing or bubblewrap
  cannot run, and the figure says which): one pipe write, one read up to the end marker.
* ``swerex_local`` -- the peer: SWE-ReX's own bash session through its ``LocalDeployment`` runtime,
  ``run_in_session(BashAction("echo hi", check="silent"))`` (pexpect on a pty, exit code fetched
  with a second command), in this process.
* ``swerex_remote`` -- the same action through SWE-ReX's ``RemoteRuntime`` to a ``swerex-remote``
  server on 127.0.0.1 (HTTP per command), the setup SWE-agent uses with its container deployments.
* ``uniagent_swerex`` -- uniagent's ``swerex`` backend on that same server (what a uniagent user
  pays for choosing SWE-ReX): one ``run_in_session`` per command, exit code from a marker.
* ``subprocess_run`` -- ``subprocess.run(["bash", "-c", "echo hi"])``: a fresh process per command.

Figures: ``echo_p50_ms`` and ``echo_p99_ms`` per method; the ratios ``swerex_local_vs_local``
(goal >= 50) and ``swerex_remote_vs_local``, ``subprocess_vs_local``; ``local_p50`` against the goal
of 2 ms; and ``start_stop_p50_ms`` for a uniagent local sandbox (start, first session, stop) and for
SWE-ReX's ``LocalDeployment`` (start, create a bash session, stop) -- both give a usable shell.

The SWE-ReX methods cost ~50-120 ms per command (pexpect waits 50 ms before each send), so they run
``--n-swerex`` commands (default 100) while the others run ``--n`` (default 1000). About a minute on
2 CPU cores. The machine may be shared: read the figures as indicative. One JSON object per line on
stdout; logs on stderr.

    .venv/bin/python bench/sandbox.py [--n 1000] [--n-swerex 100] [--starts 10]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import platform
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

os.environ.setdefault("SWE_REX_LOG_STREAM_LEVEL", "WARNING")  # before swerex sets up its loggers

from swerex.deployment.local import LocalDeployment
from swerex.runtime.abstract import BashAction, CreateBashSessionRequest
from swerex.runtime.remote import RemoteRuntime

from common import emit as common_emit
from uniagent.sandbox import Sandbox, create
from uniagent.sandbox.swerex import free_port

BENCH = "sandbox"
WARMUP = 5
GOAL_LOCAL_P50_MS = 2.0
GOAL_SWEREX_VS_LOCAL = 50.0


emit = partial(common_emit, BENCH)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def local_config() -> tuple[dict[str, Any], str]:
    """`local` when its module exists and bubblewrap runs here; otherwise `host`, said so."""
    if importlib.util.find_spec("uniagent.sandbox.local") is not None and shutil.which("bwrap"):
        probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], capture_output=True)
        if probe.returncode == 0:
            return {"type": "local"}, "local"
    return {"type": "host", "workdir": "/tmp", "i_understand_there_is_no_isolation": True}, "host"


async def time_calls(call: Callable[[], Awaitable[str]], n: int) -> list[float]:
    for _ in range(WARMUP):
        out = await call()
        if out.strip() != "hi":
            raise RuntimeError(f"unexpected output {out!r}")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t0)
    return times


def report(method: str, times: list[float], **context: Any) -> float:
    p50 = percentile(times, 50) * 1e3
    emit("echo_p50_ms", round(p50, 3), "ms", method=method, n=len(times), **context)
    emit("echo_p99_ms", round(percentile(times, 99) * 1e3, 3), "ms", method=method, n=len(times), **context)
    return p50


# -- the methods ----------------------------------------------------------------------------------
async def bench_uniagent(cfg: dict[str, Any], n: int) -> list[float]:
    async with create(cfg) as sb:

        async def call() -> str:
            return (await sb.exec("echo hi")).output

        return await time_calls(call, n)


async def bench_swerex_local(n: int) -> list[float]:
    dep = LocalDeployment()
    await dep.start()
    try:
        rt = dep.runtime
        await rt.create_session(CreateBashSessionRequest(session="bench"))

        async def call() -> str:
            return (
                await rt.run_in_session(BashAction(command="echo hi", session="bench", check="silent"))
            ).output

        return await time_calls(call, n)
    finally:
        await dep.stop()


SERVER_CMD = [sys.executable, "-m", "swerex.server", "--host", "127.0.0.1"]


class Server:
    """swerex-remote on a free loopback port, killed on exit."""

    def __init__(self) -> None:
        self.port = free_port()
        self.token = secrets.token_urlsafe(16)
        self.proc = subprocess.Popen(
            [*SERVER_CMD, "--port", str(self.port), "--auth-token", self.token],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not self._alive():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                out = self.proc.stdout.read().decode(errors="replace") if self.proc.stdout else ""
                raise RuntimeError(f"swerex-remote did not start: {out[-1000:]}")
            time.sleep(0.1)
        if self.proc.stdout:  # uvicorn's access log must not fill the pipe
            threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def _alive(self) -> bool:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/is_alive", headers={"X-API-Key": self.token}
        )
        try:
            with urllib.request.urlopen(req, timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


async def bench_swerex_remote(server: Server, n: int) -> list[float]:
    rt = RemoteRuntime(host="http://127.0.0.1", port=server.port, auth_token=server.token)
    await rt.create_session(CreateBashSessionRequest(session="bench-remote"))

    async def call() -> str:
        action = BashAction(command="echo hi", session="bench-remote", check="silent")
        return (await rt.run_in_session(action)).output

    return await time_calls(call, n)


def bench_subprocess(n: int) -> list[float]:
    times = []
    for i in range(n + WARMUP):
        t0 = time.perf_counter()
        out = subprocess.run(["bash", "-c", "echo hi"], capture_output=True, check=True).stdout
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
        elif out != b"hi\n":
            raise RuntimeError(f"unexpected output {out!r}")
    return times


async def start_stop_uniagent(cfg: dict[str, Any], k: int) -> list[float]:
    times = []
    for _ in range(k + 1):
        sb: Sandbox = create(cfg)
        t0 = time.perf_counter()
        await sb.start()
        await sb.stop()
        times.append(time.perf_counter() - t0)
    return times[1:]


async def start_stop_swerex(k: int) -> list[float]:
    times = []
    for _ in range(k + 1):
        t0 = time.perf_counter()
        dep = LocalDeployment()
        await dep.start()
        await dep.runtime.create_session(CreateBashSessionRequest(session="s"))
        await dep.stop()
        times.append(time.perf_counter() - t0)
    return times[1:]


# -- main -----------------------------------------------------------------------------------------
async def run(args: argparse.Namespace) -> None:
    t_start = time.perf_counter()
    cfg, backend = local_config()
    context = {"cpus": os.cpu_count(), "python": platform.python_version(), "command": "echo hi"}
    if backend != "local":
        logging.warning("uniagent.sandbox.local is not usable here; timing the host backend instead")

    p50: dict[str, float] = {}
    p50["local"] = report(
        f"uniagent_{backend}", await bench_uniagent(cfg, args.n), backend=backend, **context
    )
    p50["swerex_local"] = report(
        "swerex_local",
        await bench_swerex_local(args.n_swerex),
        peer="SWE-ReX LocalDeployment bash session",
        **context,
    )
    server = Server()
    try:
        p50["swerex_remote"] = report(
            "swerex_remote",
            await bench_swerex_remote(server, args.n_swerex),
            peer="SWE-ReX RemoteRuntime -> swerex-remote on 127.0.0.1",
            **context,
        )
        remote_cfg = {"type": "swerex", "url": f"http://127.0.0.1:{server.port}", "auth_token": server.token}
        p50["uniagent_swerex"] = report(
            "uniagent_swerex", await bench_uniagent(remote_cfg, args.n_swerex), **context
        )
    finally:
        server.close()
    p50["subprocess"] = report("subprocess_run", bench_subprocess(args.n), **context)

    local = p50["local"]
    emit(
        "local_p50",
        round(local, 3),
        "ms",
        backend=backend,
        goal=GOAL_LOCAL_P50_MS,
        met=local <= GOAL_LOCAL_P50_MS,
        **context,
    )
    for peer, figure in (
        ("swerex_local", "swerex_local_vs_local"),
        ("swerex_remote", "swerex_remote_vs_local"),
        ("uniagent_swerex", "uniagent_swerex_vs_local"),
        ("subprocess", "subprocess_vs_local"),
    ):
        ratio = p50[peer] / local
        goal = (
            {"goal": GOAL_SWEREX_VS_LOCAL, "met": ratio >= GOAL_SWEREX_VS_LOCAL}
            if peer == "swerex_local"
            else {}
        )
        emit(figure, round(ratio, 1), "x", backend=backend, **goal, **context)
    emit(
        "uniagent_swerex_vs_swerex_remote",
        round(p50["uniagent_swerex"] / p50["swerex_remote"], 2),
        "x",
        note="uniagent's swerex backend over SWE-ReX's own client, same server",
        **context,
    )

    ours = await start_stop_uniagent(cfg, args.starts)
    emit(
        "start_stop_p50_ms",
        round(statistics.median(ours) * 1e3, 1),
        "ms",
        method=f"uniagent_{backend}",
        what="start (incl. first session) + stop",
        n=len(ours),
        **context,
    )
    theirs = await start_stop_swerex(args.starts)
    emit(
        "start_stop_p50_ms",
        round(statistics.median(theirs) * 1e3, 1),
        "ms",
        method="swerex_local",
        what="LocalDeployment start + create_session + stop",
        n=len(theirs),
        **context,
    )
    emit(
        "start_stop_swerex_vs_local",
        round(statistics.median(theirs) / statistics.median(ours), 1),
        "x",
        backend=backend,
        **context,
    )
    emit("runtime_s", round(time.perf_counter() - t_start, 1), "s", **context)


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="commands for the uniagent local and subprocess")
    parser.add_argument("--n-swerex", type=int, default=100, help="commands for each SWE-ReX method")
    parser.add_argument("--starts", type=int, default=10, help="start+stop cycles per backend")
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
