"""DESIGN.md's one-way dependency rule, checked on the source: nothing below imports above it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "uniagent"

# Layer -> rank, the real floors: a module may import its own layer and lower ranks only. Above
# the episode stack (agent, tasks) stand the gateway's HTTP fronts (they know no task), the harness
# agents that act through them (and run episodes), the runners, then what drives them: the trainer,
# then the integrations that plug the trainer into outside frameworks (verl imports train; train
# never imports verl), then the commands that put everything together.
RANK = {
    "errors": 0,
    "registry": 0,
    "jsonio": 0,
    "config": 0,
    "cpu": 1,
    "tokens": 1,
    "parsers": 1,
    "sandbox": 1,
    "redact": 2,
    "models": 2,
    "tools": 2,
    "agent": 3,
    "tasks": 4,
    "gateway": 5,
    "harness": 6,
    "runner": 7,
    "train": 8,
    "dashboard": 9,
    "integrations": 9,
    "demo": 10,
    "doctor": 10,
    "cli": 11,
}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "uniagent" else None


def test_imports_point_down() -> None:
    problems = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] in ("tasks",) and "builtin" in rel.parts:
            continue  # bundled task repositories are data
        own = rel.parts[0].removesuffix(".py")
        if own not in RANK:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                layer = _layer(name)
                if layer in RANK and RANK[layer] > RANK[own]:
                    problems.append(f"{rel}:{node.lineno} ({own}) imports {name} ({layer})")
    assert not problems, "\n".join(problems)
