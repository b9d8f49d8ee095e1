"""The bundled search-QA suite: a corpus about an invented archipelago and questions grounded in it."""

from __future__ import annotations

import json
from pathlib import Path

import uniagent

SEARCH = Path(uniagent.__file__).resolve().parent / "tasks" / "builtin" / "search_qa"


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (SEARCH / name).read_text().splitlines() if line.strip()]


CORPUS = _jsonl("corpus.jsonl")
QUESTIONS = _jsonl("questions.jsonl")
PASSAGES = {p["id"]: p for p in CORPUS}


def test_corpus_shape():
    assert 60 <= len(CORPUS) <= 120
    assert len(PASSAGES) == len(CORPUS), "passage ids must be unique"
    assert len({p["title"] for p in CORPUS}) == len(CORPUS), "passage titles must be unique"
    for p in CORPUS:
        assert set(p) == {"id", "title", "text"}
        assert p["title"].strip() and p["id"].strip()
        assert 40 <= len(p["text"].split()) <= 150, p["id"]


def test_question_shape():
    assert len(QUESTIONS) >= 20
    ids = [q["id"] for q in QUESTIONS]
    assert len(set(ids)) == len(ids), "question ids must be unique"
    for q in QUESTIONS:
        assert set(q) == {"id", "question", "answers", "supporting_ids"}
        assert q["question"].strip().endswith("?")
        assert q["answers"] and all(isinstance(a, str) and a.strip() for a in q["answers"])
        assert q["supporting_ids"] and len(set(q["supporting_ids"])) == len(q["supporting_ids"])
    hops = [len(q["supporting_ids"]) for q in QUESTIONS]
    assert hops.count(1) >= 5 and sum(h >= 2 for h in hops) >= 5, "want both single- and two-hop questions"


def test_supporting_passages_exist():
    missing = {q["id"]: s for q in QUESTIONS for s in q["supporting_ids"] if s not in PASSAGES}
    assert missing == {}


def test_every_answer_is_in_a_supporting_passage():
    unsupported = []
    for q in QUESTIONS:
        texts = [PASSAGES[s]["text"].lower() for s in q["supporting_ids"] if s in PASSAGES]
        unsupported += [(q["id"], a) for a in q["answers"] if not any(a.lower() in t for t in texts)]
    assert unsupported == []
