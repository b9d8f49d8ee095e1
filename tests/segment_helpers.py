"""A multi-segment episode built with the real SmolLM2 codec, for the store, export and dashboard
tests: the harness's history was rewritten after two turns, so the episode has two segments,
"start" (two model turns and a tool result) and "rewritten" (its prompt is a fresh render that
holds the earlier replies as context, then one model turn).

With `versions`, the engine said which policy version sampled each token, as an asynchronous
trainer's engine does: turn k was sampled by version k, except that a weight update interrupted
the last turn halfway (partial rollout), so its second half is version 3: segment 0 spans versions
0 and 1, segment 1 versions 2 and 3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokens_sim import model_turn_ids
from uniagent.agent.result import EpisodeResult, ExitReason, Reward
from uniagent.errors import TemplateError
from uniagent.runner.store import RunStore, episode_row
from uniagent.tokens import ChatCodec, Trajectory

TASK = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
REPLIES = ["I will look at the code first.", "The sum uses minus; I fix it.", "Done: the tests pass."]


def _generate(
    traj: Trajectory, codec: ChatCodec, history: list[dict[str, Any]], turn: int, versions: bool = False
) -> None:
    """The model's turn as its template renders it (its own think block or channel header)."""
    ids = model_turn_ids(codec, history, {"role": "assistant", "content": REPLIES[turn]}, traj.token_ids)
    tags = None
    if versions:
        cut = len(ids) // 2 if turn == len(REPLIES) - 1 else len(ids)
        tags = [turn if k < cut else turn + 1 for k in range(len(ids))]
    traj.add_generation(ids, [-0.1 * (1 + (k + turn) % 7) for k in range(len(ids))], "stop", tags)


def two_segment_result(codec: ChatCodec, reward: float = 1.0, versions: bool = False) -> EpisodeResult:
    first = Trajectory(prompt_ids=codec.prompt_ids(TASK), reason="start")
    _generate(first, codec, TASK, 0, versions)
    said = [{"role": "assistant", "content": text} for text in REPLIES]
    tool = [{"role": "user", "content": "calc.py: return a - b"}]
    first.add_context(
        codec.continuation_ids(tool, history=[*TASK, said[0]], held_ids=first.token_ids), role="user"
    )
    _generate(first, codec, [*TASK, said[0], *tool], 1, versions)
    rewritten = _rewritten(codec, said)
    second = Trajectory(prompt_ids=codec.prompt_ids(rewritten), reason="rewritten")
    _generate(second, codec, rewritten, 2, versions)
    for t in (first, second):
        t.validate()
    messages: list[dict[str, Any]] = [*rewritten, {"role": "assistant", "content": REPLIES[2]}]
    metrics = {"turns": 3, "prompt_tokens": len(second.prompt_ids), "model_s": 0.3, "wall_s": 1.0}
    return EpisodeResult(
        messages, [first, second], ExitReason.FINISHED, Reward(reward, resolved=reward > 0), metrics
    )


def _rewritten(codec: ChatCodec, said: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The harness dropped the tool result: no segment extends this history, so it is rendered
    afresh. A template whose roles must alternate (Gemma) cannot show two assistant turns in a
    row: there the harness keeps a note of the result instead, and asks to go on."""
    dropped = [*TASK, said[0], said[1]]
    try:
        codec.render(dropped)
        return dropped
    except TemplateError:
        note = {"role": "user", "content": "(tool result elided)"}
        return [*TASK, said[0], note, said[1], {"role": "user", "content": "Go on."}]


def segmented_run(
    run_dir: Path, codec: ChatCodec, instance_id: str = "seg-001", versions: bool = False
) -> Path:
    """A run directory whose store (the real RunStore) holds one two-segment episode, stored as
    the runner stores it (`episode_row` of `EpisodeResult.to_dict()`)."""
    store = RunStore(run_dir / "run.db")
    store.set_meta("config", {"model": {"spec": "local"}, "tasks": {"spec": "segments"}})
    store.put(episode_row(instance_id, 0, two_segment_result(codec, versions=versions).to_dict()))
    store.close()
    return run_dir
