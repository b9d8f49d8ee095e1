"""The one registry shape (uniagent/registry.py) and every extension table built on it: a line
is imported only when looked up, an unknown name is one error naming the known ones, a missing
optional dependency says how to install it, and every line of every table resolves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from uniagent.errors import ConfigError, ToolError
from uniagent.registry import Entry, Registry, resolve

THING = object()


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    return [("thing", True, "here")]


def test_a_line_is_imported_on_first_lookup_only() -> None:
    code = (
        "import sys\n"
        "from uniagent.registry import Registry\n"
        "t = Registry('codec', {'json': 'json:dumps', 'csv': 'csv:writer'})\n"
        "assert 'csv' not in sys.modules and list(t) == ['json', 'csv']\n"
        "import json\n"
        "assert t.load('json') is json.dumps and 'csv' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_an_unknown_name_is_one_error_listing_the_known_ones() -> None:
    table = Registry("codec", {"json": "json:dumps", "csv": "csv:writer"})
    with pytest.raises(ConfigError, match=r"^unknown codec 'yaml'; known: json, csv$"):
        table.load("yaml")
    with pytest.raises(ConfigError, match="unknown codec 'yaml'"):
        table.entry("yaml")
    tools = Registry("tool", {}, error=ToolError)
    with pytest.raises(ToolError, match=r"unknown tool 'x'; known: $"):
        tools.load("x")


def test_a_missing_dependency_names_the_package_and_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two backend modules that exist but import an SDK this installation lacks.
    (tmp_path / "uniagent_test_cloud.py").write_text("import uniagent_test_cloud_sdk\nCloud = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = Registry(
        "sandbox type",
        {
            "cloud": Entry("uniagent_test_cloud:Cloud", install="pip install 'uniagent[cloud]'"),
            "plain": "uniagent_test_cloud:Cloud",
            "ghost": "uniagent.no_such_module:Thing",
        },
    )
    hint = r"'cloud' needs the Python package 'uniagent_test_cloud_sdk': install it "
    hint += r"\(pip install 'uniagent\[cloud\]'\)"
    with pytest.raises(ConfigError, match=hint):
        table.load("cloud")
    with pytest.raises(ConfigError, match=r"'plain' needs .*\(pip install uniagent_test_cloud_sdk\)"):
        table.load("plain")
    ghost = r"'ghost' is registered as uniagent\.no_such_module, which is not in this installation"
    with pytest.raises(ConfigError, match=ghost):
        table.load("ghost")


def test_lines_carry_help_and_doctor_checks_and_a_plugin_may_register_an_object() -> None:
    table = Registry(
        "part",
        {
            "a": Entry(f"{__name__}:THING", "the first", doctor=f"{__name__}:doctor_check"),
            "b": Entry(f"{__name__}:THING", doctor=__name__),  # a module alone: its doctor_check
            "c": f"{__name__}:THING",
        },
    )
    assert table.choices() == "a (the first) | b | c"
    assert table.doctor_checks() == [("a", f"{__name__}:doctor_check"), ("b", f"{__name__}:doctor_check")]
    assert resolve(table.doctor_checks()[0][1]) is doctor_check
    assert table.load("a") is THING and table["c"].module == __name__
    plugin = object()
    table["d"] = Entry(plugin)
    assert table.load("d") is plugin and table.names() == ["a", "b", "c", "d"]
    copy = table.copy()
    del copy["d"]
    assert "d" in table and "d" not in copy


def test_a_key_function_normalises_names() -> None:
    table = Registry("parser", {"qwen3_coder": "json:dumps"}, key=lambda n: n.lower().replace("-", "_"))
    assert "Qwen3-Coder" in table and table.load("QWEN3-coder") is resolve("json:dumps")


def _tables() -> dict[str, Registry]:
    from uniagent.agent.context.registry import POLICIES
    from uniagent.agent.registry import AGENTS
    from uniagent.doctor import INTEGRATIONS
    from uniagent.gateway.wire import WIRES
    from uniagent.models.registry import ENGINES
    from uniagent.parsers.registry import PARSERS
    from uniagent.runner.config import RUN_BACKENDS
    from uniagent.sandbox.registry import BACKENDS
    from uniagent.tasks.registry import FAMILIES, SUITES
    from uniagent.tools.registry import TOOLS

    return {
        "engines": ENGINES,
        "sandboxes": BACKENDS,
        "tools": TOOLS,
        "parsers": PARSERS,
        "agents": AGENTS,
        "families": FAMILIES,
        "policies": POLICIES,
        "wires": WIRES,
        "run backends": RUN_BACKENDS,
        "suites": SUITES,
        "integrations": INTEGRATIONS,
    }


@pytest.mark.parametrize("table", list(_tables()))
def test_every_line_of_every_table_resolves(table: str) -> None:
    registry = _tables()[table]
    assert isinstance(registry, Registry) and len(registry) > 0
    for name in registry:
        assert registry.load(name) is not None, f"{table}: {name}"
        entry = registry[name]
        if table != "integrations":
            assert entry.help, f"{table}: {name} has no help line (CLI help is made of it)"
    for name, ref in registry.doctor_checks():
        assert callable(resolve(ref)), f"{table}: {name}'s doctor check {ref}"


def test_the_tables_keys_agree_with_what_their_lines_name() -> None:
    tables = _tables()
    for name in tables["sandboxes"]:
        assert tables["sandboxes"].entry(name).name == name  # type: ignore[attr-defined]
    for name in tables["tools"]:
        assert tables["tools"].load(name).name == name
    for name in tables["wires"]:
        assert tables["wires"].load(name).name == name
    for name in tables["engines"]:
        assert tables["engines"].load(name).name == name
