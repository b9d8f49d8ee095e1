"""The multi-turn lookup suites (`builtin:lookup`, `builtin:lookup-easy`): the code is reachable only
through the sandbox, the verifier grades the `finish` answer, and an episode's tool results are in
its token sequence as context (mask 0) across turns.

Real parts: bubblewrap sandboxes, the ReAct loop, the SmolLM2 tokenizer and chat template, the
hermes parser. The model's turns are scripted through the real ReplayEngine where a test needs a
known path (the gold path, a wrong answer); the real SmolLM2 is in tests/test_train_learning.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from agent_helpers import call, scripted_model
from conftest import needs
from uniagent.agent import AgentConfig
from uniagent.errors import ConfigError
from uniagent.tasks import load_tasks
from uniagent.tasks.episode import run_episode
from uniagent.tasks.lookup import LookupTask, generate_rows
from uniagent.tasks.registry import SUITES

BWRAP = needs("bubblewrap", shutil.which("bwrap") is not None, "the local sandbox runs episodes in bwrap")
SUITE_FILES = {"lookup": ("chain", 3), "lookup-easy": ("easy", 2)}


@pytest.mark.parametrize("suite", sorted(SUITE_FILES))
def test_bundled_suite_is_what_generate_rows_makes(suite: str) -> None:
    """The bundled files are `generate_rows` output (regenerate with `write_suite`, never by hand)."""
    variant, _ = SUITE_FILES[suite]
    rows = [json.loads(line) for line in SUITES.load(suite).path.read_text().splitlines()]
    assert rows == generate_rows(variant)
    tasks = load_tasks(f"builtin:{suite}")
    assert len(tasks) == 64 and all(isinstance(t, LookupTask) for t in tasks)


@pytest.mark.parametrize("suite", sorted(SUITE_FILES))
def test_the_code_is_only_in_the_sandbox(suite: str) -> None:
    """What the model is told never holds the answer; exactly one file does, and codes vary."""
    tasks = load_tasks(f"builtin:{suite}")
    for task in tasks:
        prompt = json.dumps(task.messages())
        assert task.answer not in prompt, task.instance_id
        assert sum(task.answer in text for text in task.files.values()) == 1
        assert task.tools() == ["bash", "finish"]
    assert len({t.answer for t in tasks}) > 0.9 * len(tasks)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"instance_id": "x", "files": {"a": "1"}, "answer": "1"}, "needs `question` and `files`"),
        ({"instance_id": "x", "question": "q", "files": {}, "answer": "1"}, "needs `question` and `files`"),
        ({"instance_id": "x", "question": "q", "files": {"a": "1"}}, "needs `answer`"),
    ],
)
def test_bad_rows_say_what_is_missing(row: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        LookupTask(row)


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(ConfigError, match="known: chain, easy"):
        generate_rows("hard")


def _gold(task: LookupTask, suite: str) -> list[str]:
    """The replies that solve `task`: each file read shows the next line to reply with."""
    if suite == "lookup-easy":
        (file,) = task.files
        return [call("bash", command=f"cat {file}"), call("finish", answer=task.answer)]
    (file,) = [f for f in task.files if f != "note.txt"]
    return [
        call("bash", command="cat note.txt"),
        call("bash", command=f"cat {file}"),
        call("finish", answer=task.answer),
    ]


@BWRAP
@pytest.mark.parametrize("suite", sorted(SUITE_FILES))
def test_gold_path_scores_one_with_tool_results_masked(codec, suite: str) -> None:
    """The gold replies in a real sandbox: reward 1, and the trajectory alternates model spans
    (mask 1) with the tool results (mask 0): two results between three model turns for the chain,
    one between two for the easy variant. The tool results' text is in the mask-0 tokens."""
    task = load_tasks(f"builtin:{suite}", limit=1)[0]
    assert isinstance(task, LookupTask)
    model = scripted_model(codec, _gold(task, suite))
    result = asyncio.run(run_episode(task, model, AgentConfig(max_turns=4, max_format_errors=1)))
    assert result.exit_reason.value == "finished" and result.reward is not None
    assert result.reward.value == 1.0 and result.reward.resolved
    (traj,) = result.segments
    _, turns = SUITE_FILES[suite]
    kinds = [s.kind for s in traj.spans]
    assert kinds == ["model", "context"] * (turns - 1) + ["model"]
    for span in traj.spans:
        mask = traj.response_mask[span.start : span.end]
        assert set(mask) == ({1} if span.kind == "model" else {0})
    context = [
        codec.tokenizer.decode(traj.response_ids[s.start : s.end]) for s in traj.spans if s.kind == "context"
    ]
    tool_texts = [m["content"] for m in result.messages if m["role"] == "tool"][: turns - 1]
    assert len(context) == turns - 1
    for text, shown in zip(tool_texts, context, strict=True):
        assert text.splitlines()[0] in shown  # the file's content the model read, as context
    assert task.answer in context[-1]  # the code reached the model only as a tool result


@BWRAP
def test_a_guessed_or_overwritten_code_scores_zero(codec) -> None:
    """Finishing without reading (a guess), or after overwriting the file, scores 0: the verifier
    compares with the row's code, not with what the sandbox holds at the end."""
    task = load_tasks("builtin:lookup-easy", limit=1)[0]
    assert isinstance(task, LookupTask)
    (file,) = task.files
    guess = scripted_model(codec, [call("finish", answer="1234")])
    hack = scripted_model(codec, [call("bash", command=f"echo 1234 > {file}"), call("finish", answer="1234")])
    cfg = AgentConfig(max_turns=3, max_format_errors=1)
    for model in (guess, hack):
        result = asyncio.run(run_episode(task, model, cfg))
        assert result.exit_reason.value == "finished" and result.reward is not None
        assert result.reward.value == 0.0 and result.reward.details["expected"] == task.answer
