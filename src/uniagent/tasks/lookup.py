"""Multi-turn lookup: read a value that exists only in the sandbox, then `finish` with it.

Why this family exists: RL on a multi-turn agent needs a task whose answer the policy cannot
produce without acting: here each row's value is random and written into the sandbox's files at
setup, never into the prompt, so a right answer means the `bash` calls ran and their results
(context tokens, mask 0 in the trajectory) were read. The base SmolLM2-135M-Instruct solves it
sometimes, so GRPO groups carry signal from the first step (T=0.7, 40 tokens a turn, one format
error ends the episode; 32 episodes of each bundled suite through `uniagent run`: `chain` 5/32,
`easy` 2/32; docs/concepts/training.md has the command).

Rows: `{"instance_id", "question", "files": {path: text}, "answer"}` (`family: lookup` when the
file is not a bundled suite). `setup` writes `files` into the sandbox's workdir; the tools are
`bash` and `finish`; the verifier compares the `finish` answer with the row's `answer`, not with
the sandbox's copy, which the agent could overwrite before it finishes.
`generate_rows` makes the bundled suites (tasks/builtin/lookup/).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from uniagent.agent.result import EpisodeResult, Reward
from uniagent.errors import ConfigError
from uniagent.sandbox.base import Sandbox
from uniagent.tasks.base import Task

SYSTEM = "You are a helpful assistant. You answer by calling tools."


def _call(name: str, **arguments: str) -> str:
    """A tool call the hermes parser accepts, as the task and the files show it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _reply(call: str) -> str:
    return "Reply with exactly this line:\n" + call


# The task shows the first call; each file read tells the next step, the last one holds the code.
# Measured: wording that puts every step in the task text ("then read the file it names, then
# finish with the code in place of CODE") left the base model at 0/16 and 0/12; one copyable
# line per turn, found in the previous tool result, is what the 135M model can follow.
NAMES = ["box", "safe", "vault", "chest", "drawer", "locker", "shelf", "crate", "jar", "case"]


def _files(variant: str, file: str, code: str) -> tuple[str, dict[str, str]]:
    """(task text, files) for one row: `chain` reads note.txt, then the file it names (2 bash
    turns + finish); `easy` reads the code's file directly (1 bash turn + finish)."""
    last = f"The code is {code}. " + _reply(_call("finish", answer=code)) + "\n"
    if variant == "chain":
        note = _reply(_call("bash", command=f"cat {file}")) + "\n"
        return _reply(_call("bash", command="cat note.txt")), {"note.txt": note, file: last}
    return _reply(_call("bash", command=f"cat {file}")), {file: last}


VARIANTS = ("chain", "easy")


class LookupTask(Task):
    """Files written into the sandbox, a question about them, `bash` + `finish`, exact match."""

    family = "lookup"
    carries = "answer"

    def __init__(self, row: dict[str, Any], source: str | None = None) -> None:
        super().__init__(row, source)
        files = row.get("files")
        if not row.get("question") or not isinstance(files, dict) or not files:
            raise ConfigError(f"lookup task {self.instance_id!r} needs `question` and `files` (path -> text)")
        self.files: dict[str, str] = {str(k): str(v) for k, v in files.items()}
        if not str(row.get("answer", "")).strip():
            raise ConfigError(f"lookup task {self.instance_id!r} needs `answer`")
        self.answer = str(row["answer"]).strip()

    def messages(self) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": str(self.row["question"]).strip()},
        ]

    def tools(self) -> list[str | dict[str, Any]]:
        return ["bash", "finish"]

    async def setup(self, sandbox: Sandbox) -> None:
        for path, text in self.files.items():
            await sandbox.write_file(path, text)

    async def score(self, sandbox: Sandbox | None, result: EpisodeResult) -> Reward:
        given = (result.answer or "").strip()
        ok = given == self.answer
        return Reward(float(ok), ok, {"answer": given, "expected": self.answer})


def generate_rows(variant: str, n: int = 64, seed: int = 0) -> list[dict[str, Any]]:
    """`n` rows of `variant` (a key of VARIANTS), each with its own random file name and code."""
    if variant not in VARIANTS:
        raise ConfigError(f"unknown lookup variant {variant!r}; known: {', '.join(VARIANTS)}")
    rng = random.Random(f"lookup-{variant}-{seed}")
    rows: list[dict[str, Any]] = []
    for i in range(n):
        file = f"{rng.choice(NAMES)}{rng.randint(1, 99)}.txt"
        code = str(rng.randint(1000, 9999))
        question, files = _files(variant, file, code)
        rows.append(
            {"instance_id": f"{variant}-{i:03d}", "question": question, "files": files, "answer": code}
        )
    return rows


def write_suite(path: Path, variant: str, n: int = 64, seed: int = 0) -> None:
    """Write the bundled file for `variant` (how tasks/builtin/lookup/*.jsonl were made)."""
    lines = [json.dumps(row) for row in generate_rows(variant, n, seed)]
    path.write_text("\n".join(lines) + "\n")
