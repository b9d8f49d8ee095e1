"""Question answering with a search tool over a corpus the task provides.

Scored by exact match and token F1 after the usual SQuAD normalisation (lower case, no
punctuation, no articles, single spaces), against every acceptable answer.
"""

from __future__ import annotations

import collections
import re
import string
from pathlib import Path
from typing import Any

from uniagent.agent.result import EpisodeResult, Reward
from uniagent.errors import ConfigError
from uniagent.sandbox.base import Sandbox
from uniagent.tasks.base import SYSTEM_PROMPT, Task

USER_PROMPT = """Answer this question using the `search` tool over the document collection:

{question}

Search as often as you need (questions may need facts from two documents). When you know
the answer, call `finish` with a short answer (a name, a year, a number: no sentence)."""


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: list[str]) -> float:
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def f1_score(prediction: str, answers: list[str]) -> float:
    def f1(pred: str, gold: str) -> float:
        p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
        common = collections.Counter(p) & collections.Counter(g)
        same = sum(common.values())
        if not p or not g:
            return float(p == g)
        if same == 0:
            return 0.0
        precision, recall = same / len(p), same / len(g)
        return 2 * precision * recall / (precision + recall)

    return max((f1(prediction, a) for a in answers), default=0.0)


class SearchTask(Task):
    family = "search"
    carries = "answer"

    def __init__(self, row: dict[str, Any], source: str | None = None) -> None:
        super().__init__(row, source)
        if not row.get("question"):
            raise ConfigError(f"search task {self.instance_id!r} has no `question`")
        answers = row.get("answers", row.get("answer"))
        self.answers = [answers] if isinstance(answers, str) else [str(a) for a in answers or []]
        if not self.answers:
            raise ConfigError(f"search task {self.instance_id!r} has no `answers`")
        self.metric = row.get("metric", "em")
        corpus = row.get("corpus")
        self.search_url: str | None = row.get("search_url")
        if not corpus and not self.search_url:
            raise ConfigError(f"search task {self.instance_id!r} needs `corpus` (a file) or `search_url`")
        self.corpus: str | None = None
        if corpus:
            p = Path(corpus)
            if not p.is_absolute() and source:
                p = Path(source).parent / p
            self.corpus = str(p)

    def messages(self) -> list[dict[str, Any]]:
        text = USER_PROMPT.format(question=self.row["question"].strip())
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]

    def tools(self) -> list[str | dict[str, Any]]:
        search: dict[str, Any] = {"name": "search"}
        if self.search_url:
            search["url"] = self.search_url
        else:
            search["corpus"] = self.corpus
        return [search, "finish"]

    async def score(self, sandbox: Sandbox | None, result: EpisodeResult) -> Reward:
        answer = result.answer or ""
        em, f1 = exact_match(answer, self.answers), f1_score(answer, self.answers)
        value = f1 if self.metric == "f1" else em
        return Reward(value, em == 1.0, {"answer": answer, "answers": self.answers, "em": em, "f1": f1})
