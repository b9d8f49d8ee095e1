"""A tiny task family for watching RL work on a laptop CPU: answer a one-step question with `finish`.

Why this family exists: a 135M model almost never fixes a SWE bug, so a reward curve on the real
suites stays flat at zero and shows nothing. Here the whole episode is one short model turn (a
`finish` tool call in the parser's format), the verifier is an exact match of the answer, and the
base SmolLM2-135M-Instruct gets it right often enough that group advantages are non-zero and
learning shows within tens of steps. Measured base rates (16 episodes each): single-digit
additions 0% (it answers in prose), bare "call finish with X" 0% at T=1.0 and T=0.6, and these
"reply with exactly this call" rows 19% at T=0.7, the setting `configs/train_local.yaml` uses.

Rows (`tasks/toy.jsonl` next to this file, or any file whose rows carry `family: toy`):
`{"instance_id": ..., "question": ..., "answer": ...}`. `generate_rows` makes the bundled file.

The task needs no sandbox commands (`finish` only records the answer), so it runs in whatever
sandbox the trainer is configured with; `sandbox: {type: local}` (bubblewrap) is the default.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from uniagent.agent.result import EpisodeResult, Reward
from uniagent.errors import ConfigError
from uniagent.sandbox.base import Sandbox
from uniagent.tasks.base import Task
from uniagent.tasks.search import normalize_answer

TOY_FILE = Path(__file__).parent / "tasks" / "toy.jsonl"

SYSTEM = "You are a helpful assistant. You answer by calling the `finish` tool."
USER = "{question}"

WORDS = [
    "apple",
    "banana",
    "cherry",
    "falcon",
    "river",
    "stone",
    "cloud",
    "maple",
    "tiger",
    "ocean",
    "lemon",
    "pepper",
    "silver",
    "candle",
    "garden",
    "rocket",
    "planet",
    "violet",
    "winter",
    "summer",
    "copper",
    "forest",
    "island",
    "mirror",
]


class ToyTask(Task):
    """One question, one exact-match answer, the `finish` tool only."""

    family = "toy"
    carries = "answer"

    def __init__(self, row: dict[str, Any], source: str | None = None) -> None:
        super().__init__(row, source)
        if not row.get("question") or "answer" not in row:
            raise ConfigError(f"toy task {self.instance_id!r} needs `question` and `answer`")
        self.answer = str(row["answer"])

    def messages(self) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": USER.format(question=str(self.row["question"]).strip())},
        ]

    def tools(self) -> list[str | dict[str, Any]]:
        return ["finish"]

    async def score(self, sandbox: Sandbox | None, result: EpisodeResult) -> Reward:
        given = result.answer or ""
        ok = normalize_answer(given) == normalize_answer(self.answer)
        return Reward(float(ok), ok, {"answer": given, "expected": self.answer})


def generate_rows(n: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    """ "Say the magic word" rows: the answer is in the question, so success is mostly the tool format.

    That is the point of a toy: the base model sometimes writes a correct `finish` call and often
    does not (extra prose, a wrong argument name, a paraphrased word), and RL visibly sharpens it.
    """
    rng = random.Random(seed)
    call = '<tool_call>{{"name": "finish", "arguments": {{"answer": "{a}"}}}}</tool_call>'
    templates = [
        "Reply with exactly this line:\n" + call.format(a="{w}"),
        "The magic word is {w}. Reply with exactly this line, the magic word in place of WORD:\n"
        + call.format(a="WORD"),
    ]
    rows: list[dict[str, Any]] = []
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        template = templates[(i // len(WORDS) + i) % len(templates)]
        rows.append(
            {
                "instance_id": f"word-{i:03d}",
                "family": "toy",
                "question": template.replace("{w}", word),
                "answer": word,
            }
        )
    rng.shuffle(rows)
    return rows


def load_toy_tasks(path: str | Path | None = None, limit: int | None = None) -> list[Task]:
    """Tasks from a toy file (default: the bundled one) without touching the task registry."""
    from uniagent.tasks.loading import load_rows

    file = Path(path) if path else TOY_FILE
    if not file.exists():
        raise ConfigError(f"toy task file {file} does not exist")
    tasks: list[Task] = [ToyTask.from_row(row, source=str(file)) for row in load_rows(file)]
    return tasks[:limit] if limit else tasks
