"""Candidate bugs for `uniagent tasks make`: small AST-level rewrites inside a module's functions.

Each rewrite is found on the module's `ast` tree but applied as a replacement of a precise source
span (an operator between its two operands, one constant, two arguments, whole statement lines),
so the bug's diff is as small as the change itself and the file's formatting stays as it was. A
rewrite whose module no longer parses is dropped. Kinds: `operator` (arithmetic and boolean
operators), `comparison`, `off_by_one` (an integer constant in a bound, index or range),
`swap_args` (the first two positional arguments of a call), `drop_branch` (an `if` with no
`else`), `drop_statement` (one statement of a body that keeps others).
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from dataclasses import asdict, dataclass
from typing import Any

_BINOPS: dict[type[ast.operator], tuple[str, str]] = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "//"),
    ast.FloorDiv: ("//", "*"),
    ast.Div: ("/", "*"),
    ast.Mod: ("%", "//"),
}
_CMPOPS: dict[type[ast.cmpop], tuple[str, str]] = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}
_BOOLOPS: dict[type[ast.boolop], tuple[str, str]] = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
KINDS = ("operator", "comparison", "off_by_one", "swap_args", "drop_branch", "drop_statement")


@dataclass(frozen=True)
class Mutation:
    """One candidate bug: replace `text[start:end]` of `path` (character offsets) with `new`."""

    path: str
    kind: str
    function: str
    line: int
    start: int
    end: int
    old: str
    new: str

    @property
    def id(self) -> str:
        """Stable over runs (so a work dir can be resumed): a digest of the change itself."""
        key = f"{self.path}:{self.start}:{self.end}:{self.new}"
        return hashlib.sha256(key.encode()).hexdigest()[:10]

    def apply(self, text: str) -> str:
        return text[: self.start] + self.new + text[self.end :]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "id": self.id}


class _Offsets:
    """(line, col) of `ast` (1-based lines, UTF-8 byte columns) to character offsets of the text."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, col: int) -> int:
        raw = self.lines[line - 1].encode("utf-8")[:col]
        return self.starts[line - 1] + len(raw.decode("utf-8", errors="replace"))


def _gap_op(text: str, a: int, b: int, old: str) -> tuple[int, int] | None:
    """The span of operator `old` in `text[a:b]` (between two operands), when it is the gap's
    only content besides spaces and parentheses."""
    gap = text[a:b]
    pattern = r"[\s()]*(" + r"\s+".join(re.escape(w) for w in old.split()) + r")[\s()]*"
    m = re.fullmatch(pattern, gap)
    return (a + m.start(1), a + m.end(1)) if m else None


def _whole_lines(text: str, off: _Offsets, node: ast.stmt) -> tuple[int, int] | None:
    """The span of the lines `node` occupies, when nothing else shares them (no `;`)."""
    assert node.end_lineno is not None and node.end_col_offset is not None
    first = off.lines[node.lineno - 1]
    last = off.lines[node.end_lineno - 1]
    if first[: off.at(node.lineno, node.col_offset) - off.starts[node.lineno - 1]].strip():
        return None
    tail = last[off.at(node.end_lineno, node.end_col_offset) - off.starts[node.end_lineno - 1] :]
    if tail.strip() and not tail.strip().startswith("#"):
        return None
    return off.starts[node.lineno - 1], off.starts[node.end_lineno]


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str, text: str) -> None:
        self.path, self.text, self.off = path, text, _Offsets(text)
        self.found: list[Mutation] = []
        self.function: list[str] = []

    def _add(self, kind: str, node: ast.AST, start: int, end: int, new: str) -> None:
        if not self.function or self.text[start:end] == new:
            return
        self.found.append(
            Mutation(
                self.path,
                kind,
                ".".join(self.function),
                getattr(node, "lineno", 0),
                start,
                end,
                self.text[start:end],
                new,
            )
        )

    def _pos(self, node: ast.AST, end: bool = False) -> int:
        if end:
            return self.off.at(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        return self.off.at(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    # -- scopes ---------------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.function.append(node.name)
        for stmt in node.body:  # defaults and decorators run at import time: not mutated
            self.visit(stmt)
        self._bodies(node)
        self.function.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.function.append(node.name)
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.visit(stmt)
        self.function.pop()

    def _bodies(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """Statements to drop: in any body of the function that keeps another statement."""
        for node in ast.walk(fn):
            for field in ("body", "orelse", "finalbody"):
                body = getattr(node, field, None)
                if not isinstance(body, list) or len(body) < 2 or isinstance(node, ast.ClassDef):
                    continue
                for i, stmt in enumerate(body):
                    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        continue
                    if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                        continue  # a docstring
                    rest = [s for j, s in enumerate(body) if j != i and not _is_docstring(s, j)]
                    if not rest:
                        continue
                    span = _whole_lines(self.text, self.off, stmt)
                    if span is None:
                        continue
                    if isinstance(stmt, ast.If) and not stmt.orelse:
                        self._add("drop_branch", stmt, *span, "")
                    elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Expr, ast.Return, ast.Raise)):
                        self._add("drop_statement", stmt, *span, "")

    # -- expressions ----------------------------------------------------------------------
    def visit_BinOp(self, node: ast.BinOp) -> None:
        ops = _BINOPS.get(type(node.op))
        if ops and not (isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)):
            span = _gap_op(self.text, self._pos(node.left, True), self._pos(node.right), ops[0])
            if span:
                self._add("operator", node, *span, ops[1])
        if isinstance(node.op, (ast.Add, ast.Sub)):
            self._off_by_one(node.right)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        old, new = _BOOLOPS[type(node.op)]
        span = _gap_op(self.text, self._pos(node.values[0], True), self._pos(node.values[1]), old)
        if span:
            self._add("operator", node, *span, new)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            old, new = _CMPOPS[type(op)]
            span = _gap_op(self.text, self._pos(left, True), self._pos(right), old)
            if span:
                self._add("comparison", node, *span, new)
            self._off_by_one(right)
            left = right
        self.generic_visit(node)

    def visit_Slice(self, node: ast.Slice) -> None:
        for part in (node.lower, node.upper):
            if part is not None:
                self._off_by_one(part)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not isinstance(node.slice, ast.Slice):
            self._off_by_one(node.slice)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        args = node.args
        if isinstance(node.func, ast.Name) and node.func.id == "range":
            for a in args:
                self._off_by_one(a)
        if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
            a0, a1 = args[0], args[1]
            s0, e0, s1, e1 = self._pos(a0), self._pos(a0, True), self._pos(a1), self._pos(a1, True)
            t0, t1 = self.text[s0:e0], self.text[s1:e1]
            if t0 != t1:
                self._add("swap_args", node, s0, e1, t1 + self.text[e0:s1] + t0)
        self.generic_visit(node)

    def _off_by_one(self, node: ast.AST) -> None:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            node = node.operand
        if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value < 1000:
            s, e = self._pos(node), self._pos(node, True)
            if self.text[s:e].isdigit():
                self._add("off_by_one", node, s, e, str(node.value + (1 if node.value == 0 else -1)))


def _is_docstring(stmt: ast.stmt, index: int) -> bool:
    return index == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def find(path: str, text: str) -> list[Mutation]:
    """Every candidate bug of one module's source; those whose result does not parse are left out."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    finder = _Finder(path, text)
    finder.visit(tree)
    seen: set[str] = set()
    out: list[Mutation] = []
    for m in finder.found:
        if m.id in seen:
            continue
        seen.add(m.id)
        try:
            ast.parse(m.apply(text))
        except SyntaxError:
            continue
        out.append(m)
    return out


def sample(found: list[Mutation], limit: int | None, seed: int) -> list[Mutation]:
    """A seeded, varied order: shuffled, then dealt round-robin over (kind, function) so the first
    `limit` candidates spread over kinds and functions instead of one long function's operators."""
    rng = random.Random(seed)
    pool = sorted(found, key=lambda m: (m.path, m.start, m.id))
    rng.shuffle(pool)
    groups: dict[tuple[str, str], list[Mutation]] = {}
    for m in pool:
        groups.setdefault((m.kind, f"{m.path}:{m.function}"), []).append(m)
    keys = list(groups)
    rng.shuffle(keys)
    dealt: list[Mutation] = []
    while keys:
        for k in list(keys):
            dealt.append(groups[k].pop())
            if not groups[k]:
                keys.remove(k)
    return dealt[:limit] if limit else dealt
