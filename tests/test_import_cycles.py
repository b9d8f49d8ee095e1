"""Import cycles among the modules of one folder, read from the source: every import counts, at the
top of a module, inside a function (a lazy import is a cycle a reader still has to follow) or under
`TYPE_CHECKING`. None is left; a new one fails."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# None left (issue 26 part 1 broke them all); a cycle that appears fails the test below.
KNOWN: set[frozenset[str]] = set()


def _modules() -> dict[str, tuple[Path, str]]:
    """Dotted name (without `uniagent.`) -> (file, its folder's dotted name)."""
    out = {}
    for path in (SRC / "uniagent").rglob("*.py"):
        parts = list(path.relative_to(SRC / "uniagent").with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            folder = ".".join(parts)
        else:
            folder = ".".join(parts[:-1])
        if parts:
            out[".".join(parts)] = (path, folder)
    return out


def _edges(mods: dict[str, tuple[Path, str]]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, (path, folder) in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                short = target.removeprefix("uniagent.")
                same_folder = short in mods and mods[short][1] == folder
                if target.startswith("uniagent.") and same_folder and short != name:
                    edges.setdefault(name, set()).add(short)
    return edges


def _cycles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.add(frozenset(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_no_new_import_cycle_inside_a_folder() -> None:
    new = _cycles(_edges(_modules())) - KNOWN
    assert not new, [" <-> ".join(sorted(c)) for c in new]


def test_the_check_sees_a_lazy_import_cycle() -> None:
    edges = {"a.x": {"a.y"}, "a.y": {"a.x"}, "a.z": {"a.x"}}
    assert _cycles(edges) == {frozenset({"a.x", "a.y"})}
