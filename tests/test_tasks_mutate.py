"""Candidate bugs of `uniagent tasks make` (`uniagent.tasks.mutate`): each kind is found, the
rewrite touches only its own span, the module still parses, and the order is the seed's."""

from __future__ import annotations

import ast
import difflib

from uniagent.tasks import mutate

SOURCE = '''"""A module."""

LIMIT = 3 + 4  # module level: never mutated


def window(items, size=2):
    """Docstring stays."""
    out = []
    for i in range(len(items) - 1):
        if i % 2 == 0:
            out.append(items[i : i + size])
        if size > 1 and items:
            out.append(max(items[0], items[-1]))
    return out


class Box:
    def area(self, w, h):
        total = w * h
        return total - 1 if total >= 10 else total
'''


def changed_lines(before: str, after: str) -> list[str]:
    return [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def test_every_kind_is_found_and_each_rewrite_is_minimal() -> None:
    found = mutate.find("pkg/mod.py", SOURCE)
    kinds = {m.kind for m in found}
    assert kinds == set(mutate.KINDS)
    for m in found:
        after = m.apply(SOURCE)
        ast.parse(after)
        assert m.function in ("window", "Box.area"), m  # nothing at module level
        assert SOURCE[m.start : m.end] == m.old
        lines = changed_lines(SOURCE, after)
        if m.kind.startswith("drop_"):
            assert all(line.startswith("-") for line in lines), m
        else:  # one line changed in place
            assert len(lines) == 2, (m, lines)
    docstring = [m for m in found if "Docstring" in m.old]
    assert not docstring


def test_examples_of_each_kind() -> None:
    found = {(m.kind, m.old, m.new) for m in mutate.find("pkg/mod.py", SOURCE)}
    assert ("comparison", ">", ">=") in found
    assert ("comparison", ">=", ">") in found
    assert ("operator", "and", "or") in found
    assert ("operator", "*", "//") in found
    assert ("off_by_one", "1", "0") in found  # range(len(items) - 1)
    assert ("swap_args", "items[0], items[-1]", "items[-1], items[0]") in found
    dropped_if = [old for kind, old, _ in found if kind == "drop_branch"]
    assert any(old.lstrip().startswith("if i % 2 == 0:") for old in dropped_if)


def test_ids_are_stable_and_the_order_is_the_seeds() -> None:
    a = mutate.find("pkg/mod.py", SOURCE)
    b = mutate.find("pkg/mod.py", SOURCE)
    assert [m.id for m in a] == [m.id for m in b]
    assert len({m.id for m in a}) == len(a)
    s0 = [m.id for m in mutate.sample(a, 5, seed=0)]
    assert s0 == [m.id for m in mutate.sample(b, 5, seed=0)]
    assert s0 != [m.id for m in mutate.sample(a, 5, seed=1)]
    assert len({m.kind for m in mutate.sample(a, 6, seed=0)}) >= 4  # dealt over kinds


def test_a_file_that_does_not_parse_has_no_candidates() -> None:
    assert mutate.find("bad.py", "def f(:\n") == []
