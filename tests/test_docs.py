"""The manual builds, strictly, and its generated references cover the code.

`mkdocs build --strict` fails on a broken link or anchor, a page missing from the nav and a
generator error, so running it here makes `make test` catch a manual that no longer matches the
tree. mkdocs is a dev dependency (`make setup` installs it): missing, the test fails, it does not
skip. Never pass `-q` to the build: mkdocs' quiet mode drops the warnings that strict mode counts.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]


def _generator() -> ModuleType:
    path = ROOT / "docs" / "hooks" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_manual_builds_strict(tmp_path: Path) -> None:
    assert importlib.util.find_spec("mkdocs") is not None, "mkdocs is missing: run `make setup`"
    assert importlib.util.find_spec("material") is not None, "mkdocs-material is missing: run `make setup`"
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config_page = (site / "reference" / "configuration" / "index.html").read_text()
    cli_page = (site / "reference" / "cli" / "index.html").read_text()
    assert "agent.context.policy" in config_page
    assert "runner.stop_after_infra_failures" in config_page
    assert "--max-turns" in cli_page and "uniagent verl launch" in cli_page


def _keys(cls: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in cls.model_fields.items():
        key = f"{prefix}{name}"
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out.extend(_keys(sub, key + "."))
        else:
            out.append(key)
    return out


def test_configuration_reference_lists_every_setting() -> None:
    from uniagent.runner.config import RunConfig
    from uniagent.sandbox.registry import BACKENDS
    from uniagent.train.config import TrainConfig

    page = _generator().config_reference()
    for root in (RunConfig, TrainConfig):
        for key in _keys(root):
            assert f"`{key}`" in page, key
    for name, backend in BACKENDS.items():
        assert f"`sandbox` type `{name}`" in page, name
        for field in backend.config_class().model_fields:
            assert f"`sandbox.{field}`" in page, (name, field)


def _commands(group: Any, path: str) -> list[str]:
    out = []
    for name, cmd in group.commands.items():
        out.append(f"{path} {name}")
        if hasattr(cmd, "commands"):
            out.extend(_commands(cmd, f"{path} {name}"))
    return out


def test_cli_reference_lists_every_command_and_option() -> None:
    import typer

    from uniagent.cli import app

    page = _generator().cli_reference()
    group = typer.main.get_command(app)
    for command in _commands(group, "uniagent"):
        assert f"`{command}`" in page, command
    run = group.commands["run"]
    for param in run.params:
        for flag in param.opts:
            if flag.startswith("--"):
                assert f"`{flag}`" in page, flag


def test_exit_reason_table_matches_the_code() -> None:
    """The manual's table of exit reasons names each one with the side the code gives it."""
    from uniagent.agent.result import ExitReason

    page = (ROOT / "docs" / "concepts" / "episodes.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (policy|infrastructure) \|", page, flags=re.M))
    assert set(rows) == {reason.value for reason in ExitReason}
    for reason in ExitReason:
        assert (rows[reason.value] == "policy") == reason.trainable, reason


def test_readme_links_resolve() -> None:
    """The README is a first visit's page: every relative link it has lands on a file."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links into the manual"
    missing = [link for link in relative if not (ROOT / link).is_file()]
    assert not missing, missing


def test_the_architecture_pages_layer_table_is_the_layer_tests() -> None:
    """The ranks the manual shows are the ones `test_layers` enforces."""
    from test_layers import RANK

    shown: dict[str, int] = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            for name in cells[1].split(","):
                shown[name.strip().strip("`")] = int(cells[0])
    assert shown == RANK
