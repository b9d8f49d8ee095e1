"""The sandbox backend registry: a backend is one module (its config, its Sandbox, its
`doctor_check`) plus one line in `BACKENDS`, and then `create`, `parse_config`, `retarget` and
`uniagent doctor` all know it. This module is such a backend (a real shell on this machine, in a
temp dir, like `host`), registered for the test only."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Literal

import pytest

from uniagent import doctor
from uniagent.errors import ConfigError
from uniagent.sandbox import PipeShellSandbox, Sandbox, create, parse_config, procs
from uniagent.sandbox.config import retarget
from uniagent.sandbox.registry import BACKENDS, Backend, backend
from uniagent.sandbox.settings import SandboxConfig


class EchoConfig(SandboxConfig):
    type: Literal["echo"] = "echo"
    greeting: str = "hello"


class EchoSandbox(PipeShellSandbox):
    kind = "echo"
    kill_trees_on_stop = True

    async def _start(self) -> None:
        os.makedirs(self.workdir, exist_ok=True)

    async def _stop(self) -> None:
        return None

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        return await procs.spawn(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
        )


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    return [("sandbox echo", True, "registered by a test")]


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> Backend:
    line = Backend(f"{__name__}:EchoSandbox", config="EchoConfig")
    monkeypatch.setitem(BACKENDS, "echo", line)  # the one line a new backend adds
    return line


async def test_a_registered_backend_is_created_parsed_and_checked(echo: Backend, tmp_path: Path) -> None:
    cfg = parse_config({"type": "echo", "greeting": "hi", "workdir": str(tmp_path)})
    assert isinstance(cfg, EchoConfig) and cfg.greeting == "hi"
    sb = create({"type": "echo", "workdir": str(tmp_path), "env": {"WHO": "registry"}})
    assert isinstance(sb, EchoSandbox) and isinstance(sb, Sandbox)
    async with sb:
        res = await sb.exec("echo $WHO; pwd")
        assert res.output.split() == ["registry", str(tmp_path)]
    assert backend("echo") is echo and echo.name == "echo" and echo.module == __name__
    assert "echo" in doctor.sandbox_types()
    assert ("echo", f"{__name__}:doctor_check") in BACKENDS.doctor_checks()
    checks = await doctor._run(f"{__name__}:doctor_check", "sandbox echo", required=False)
    assert [(c.name, c.ok) for c in checks] == [("sandbox echo", True)]
    # Settings move onto it like onto any backend; what it cannot honour is named.
    assert retarget({"type": "local", "env": {"A": "1"}}, "echo").env == {"A": "1"}
    with pytest.raises(ConfigError, match="network"):
        retarget({"type": "local", "network": True}, "echo")


def test_unknown_types_are_named_with_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="unknown sandbox type 'nope'; known: local, host, container"):
        backend("nope")
    with pytest.raises(
        ConfigError, match=r"sandbox\.type: unknown sandbox type 'nope'; known: local, host, container"
    ):
        parse_config({"type": "nope"})


def test_every_backend_line_names_its_config_and_class() -> None:
    for name, line in BACKENDS.items():
        assert line.name == name
        cls = line.sandbox_class()
        assert issubclass(cls, Sandbox) and cls.kind == name
        # Pipe-shell hooks (_spawn, _signal_tree, ...) only where bash runs over pipes.
        assert issubclass(cls, PipeShellSandbox) == (name != "swerex"), name
        assert not hasattr(Sandbox, "_spawn") and not hasattr(Sandbox, "_signal_tree")


def test_a_backend_missing_its_sdk_is_a_config_error_with_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both of a line's objects (config class, sandbox class) load through the table's error mapping."""
    (tmp_path / "uniagent_test_cloudbox.py").write_text("import uniagent_test_cloudbox_sdk\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = Backend("uniagent_test_cloudbox:Box", config="BoxConfig", install="pip install 'uniagent[box]'")
    monkeypatch.setitem(BACKENDS, "box", line)
    hint = r"'box' needs the Python package 'uniagent_test_cloudbox_sdk': install it "
    hint += r"\(pip install 'uniagent\[box\]'\)"
    with pytest.raises(ConfigError, match=hint):
        parse_config({"type": "box"})
    with pytest.raises(ConfigError, match=hint):
        line.sandbox_class()
