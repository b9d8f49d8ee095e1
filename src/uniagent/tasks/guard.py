"""What a graded patch may not change: how the tests are collected, run or reported.

RL optimises whatever the grader pays for, so a patch that leaves the bug alone but changes
the test run would be paid as a fix. Every way a patch can reach the test runner falls in one
of three kinds, each handled by the rule that keeps legitimate work gradable:

- **Stripped** (`stripped_path`; the file stays as it is at the base commit): files whose only
  role is test configuration or start-up (pytest.ini, .pytest.ini, pytest.toml, tox.ini,
  conftest.py and noxfile.py at any depth, sitecustomize.py / usercustomize.py, .pythonrc),
  and files that are never source: packaging metadata a plugin can be registered through
  (`*.egg-info/`, `*.dist-info/`, `entry_points.txt`, `*.egg-link`), `.pth` start-up files,
  and compiled bytecode (`__pycache__/`, `*.pyc`).
- **Refused** (`screen`; the patch is graded unresolved with the reason, tests not run):
  a change to the pytest part of a file that also holds other settings
  (pyproject.toml `[tool.pytest]` / `[tool.pytest.ini_options]`, setup.cfg `[tool:pytest]`,
  and `pytest11` plugin entry points in pyproject.toml, setup.cfg or setup.py). The rest of
  those files (dependencies, version, other tools) is the agent's to change.
- **Refused**: a new module that would shadow the test runner, its dependencies or the
  standard library (`pytest.py`, `_pytest/`, `pluggy`, `iniconfig`, `pprint.py`, ...) from a
  directory that is not inside a package (the workspace root, `src/`, ...): `python -m
  pytest` puts the workspace first on `sys.path`, so such a file runs instead of the real one.
  (Running the tests with `python -P` would also stop it, but it would take the workspace off
  `sys.path`, and the package under test of a repository that is not installed with it.)

What a patch can still do is tamper from the code under test itself: a module the tests
import can monkeypatch `_pytest` when it is imported, print PASSED lines or leave early. No
static rule can tell that from a fix; `uniagent.tasks.witness` catches it at run time for pytest
runs (the grader's own plugin and records; its docstring says what stays possible in principle
and which rows are still graded from their log alone). Beyond that, the graded tests come from
the task (the test patch is applied after the agent's), and an expected test with no result
counts as failed.
"""

from __future__ import annotations

import configparser
import posixpath
import secrets
import sys
import tomllib
from typing import Any

from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.procs import quote
from uniagent.tasks.repo import GIT, run_checked

STRIPPED_NAMES = {
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "tox.ini",
    "noxfile.py",
    "sitecustomize.py",
    "usercustomize.py",
    ".pythonrc",
    ".pythonrc.py",
    "entry_points.txt",
}
_STRIPPED_SUFFIXES = (".pth", ".pyc", ".pyo", ".egg-link")
_METADATA_DIRS = (".egg-info", ".dist-info")
# The test runner and what it imports; with the standard library, the names no new module
# outside a package may take.
RUNNER_MODULES = {
    "pytest",
    "_pytest",
    "pluggy",
    "py",
    "iniconfig",
    "packaging",
    "exceptiongroup",
    "tomli",
    "colorama",
    "pygments",
    "xdist",
    "setuptools",
    "pkg_resources",
    "_distutils_hack",
    "importlib_metadata",
    "typing_extensions",
    "sitecustomize",
    "usercustomize",
}
_CONFIG_FILES = ("pyproject.toml", "setup.cfg")


def stripped_path(path: str) -> bool:
    """A file a patch may not change at all (its change is dropped; the base version stays)."""
    parts = path.split("/")
    name = parts[-1]
    return (
        name in STRIPPED_NAMES
        or name.endswith(_STRIPPED_SUFFIXES)
        or "__pycache__" in parts[:-1]
        or any(p.endswith(_METADATA_DIRS) for p in parts[:-1])
    )


def shadowing_name(module: str) -> bool:
    return (
        module in RUNNER_MODULES
        or module in sys.stdlib_module_names
        or module.startswith(("pytest_", "_pytest"))
    )


def pytest_settings(name: str, text: str | None) -> Any:
    """The part of pyproject.toml / setup.cfg that configures pytest or registers a plugin
    (None where there is none); raises ValueError when the file cannot be parsed."""
    if text is None:
        return None
    if name == "pyproject.toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"not valid TOML ({exc})") from None
        tool = data.get("tool") or {}
        found = {
            "tool.pytest": tool.get("pytest"),
            "project.entry-points.pytest11": ((data.get("project") or {}).get("entry-points") or {}).get(
                "pytest11"
            ),
            "tool.poetry.plugins.pytest11": ((tool.get("poetry") or {}).get("plugins") or {}).get("pytest11"),
        }
    else:
        cfg = configparser.RawConfigParser(strict=False)
        try:
            cfg.read_string(text)
        except configparser.Error as exc:
            raise ValueError(f"not a valid setup.cfg ({exc.message})") from None
        found = {s: dict(cfg[s]) for s in ("tool:pytest", "pytest") if cfg.has_section(s)}
        if cfg.has_option("options.entry_points", "pytest11"):
            found["options.entry_points.pytest11"] = cfg.get("options.entry_points", "pytest11")
    found = {k: v for k, v in found.items() if v is not None}
    return found or None


async def _sh(sandbox: Sandbox, command: str) -> tuple[bool, str]:
    res = await sandbox.exec(command, timeout=300, cwd=sandbox.workdir, session="_setup", max_output=None)
    return res.ok, res.output


async def changed_files(
    sandbox: Sandbox, base: str, exclude: tuple[str, ...] = ()
) -> tuple[list[str], set[str]]:
    """Every path the applied patch changed against `base` (ignored files included, so
    metadata a patch adds under an ignored name is seen), and which of them are new."""
    specs = " ".join(quote(f":(exclude){p}") for p in exclude)
    tmp = f"/tmp/.uniagent_changed_{secrets.token_hex(6)}"
    await run_checked(
        sandbox,
        f"{GIT} ls-files -z --others -- . {specs} > {tmp}.new && "
        f"{GIT} diff -z --name-only --no-renames {quote(base)} -- . {specs} > {tmp}.changed",
        "listing the files the patch changed",
    )
    # Read back as bytes: a path may hold any character but NUL.
    lists = [await sandbox.read_file(f"{tmp}.{k}") for k in ("new", "changed")]
    await sandbox.exec(f"rm -f {tmp}.new {tmp}.changed", session="_setup")
    new, changed = ({p.decode("utf-8", "surrogateescape") for p in raw.split(b"\0") if p} for raw in lists)
    return sorted(new | changed), new


async def restore(sandbox: Sandbox, base: str, paths: list[str], new: set[str]) -> None:
    """Put `paths` back as they are at `base` (new files are removed)."""
    if not paths:
        return
    gone = [p for p in paths if p in new]
    back = [p for p in paths if p not in new]
    lines = [f"rm -f -- {' '.join(quote(p) for p in gone)}"] if gone else []
    if back:
        lines.append(f"{GIT} checkout -q {quote(base)} -- {' '.join(quote(p) for p in back)}")
    await run_checked(sandbox, " && ".join(lines), "restoring test files from the base commit")


async def screen(sandbox: Sandbox, base: str, changed: list[str], new: set[str]) -> str | None:
    """Why the patch, as applied, is refused (see the module docstring), or None."""
    for path in changed:
        name = posixpath.basename(path)
        if name not in (*_CONFIG_FILES, "setup.py"):
            continue
        ok, now = await _sh(sandbox, f"cat -- {quote(path)} 2>/dev/null")
        ok_base, before = await _sh(sandbox, f"{GIT} show {quote(f'{base}:{path}')} 2>/dev/null")
        now_text, base_text = (now if ok else None), (before if ok_base else None)
        if name == "setup.py":
            if (now_text or "").count("pytest11") > (base_text or "").count("pytest11"):
                return f"{path}: the patch registers a pytest plugin (a pytest11 entry point)"
            continue
        try:
            old = pytest_settings(name, base_text)
        except ValueError:
            old = {"unparsable": base_text}
        try:
            cur = pytest_settings(name, now_text)
        except ValueError as exc:
            return f"{path}: {exc}"
        if old != cur:
            keys = sorted(k for k in {*(old or {}), *(cur or {})} if (old or {}).get(k) != (cur or {}).get(k))
            return f"{path}: the patch changes pytest's settings ({', '.join(keys)})"
    return await _shadowing(sandbox, sorted(new))


def _module_of(path: str) -> tuple[str, list[str]] | None:
    """The top-level module name a new file would provide, and the directories it sits in."""
    parts = path.split("/")
    name = parts[-1]
    if name == "__init__.py" and len(parts) > 1:
        return parts[-2], parts[:-2]
    if name.endswith(".py"):
        return name[:-3], parts[:-1]
    if name.endswith((".so", ".pyd")) or "." not in name:  # extension modules; symlinked packages
        return name.split(".")[0], parts[:-1]
    return None


async def _shadowing(sandbox: Sandbox, new: list[str]) -> str | None:
    """A new module named like the runner, its dependencies or a standard module, in a
    directory outside any package (where it would be found before the real one)."""
    for path in new:
        found = _module_of(path)
        if found is None or not shadowing_name(found[0]):
            continue
        module, dirs = found
        ancestors = ["/".join(dirs[:k]) for k in range(1, len(dirs) + 1)]
        if ancestors:
            checks = " || ".join(f"test -f {quote(d + '/__init__.py')}" for d in ancestors)
            _, out = await _sh(sandbox, f"if {checks}; then echo inside-a-package; fi")
            if "inside-a-package" in out:
                continue
        where = "at the top of the workspace" if not dirs else "outside any package"
        return f"{path}: a new module `{module}` {where} would run instead of the real one"
    return None
