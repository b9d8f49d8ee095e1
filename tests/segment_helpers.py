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

from uniagent.agent.result import EpisodeResult, ExitReason, Reward
from uniagent.runner.store import RunStore, episode_row
from uniagent.tokens import ChatCodec, Trajectory

TASK = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
REPLIES = ["I will look at the code first.", "The sum uses minus; I fix it.", "Done: the tests pass."]


def _generate(traj: Trajectory, codec: ChatCodec, text: str, turn: int, versions: bool = False) -> None:
    ids = codec.encode(text) + codec.eot_ids
    tags = None
    if versions:
        cut = len(ids) // 2 if turn == len(REPLIES) - 1 else len(ids)
        tags = [turn if k < cut else turn + 1 for k in range(len(ids))]
    traj.add_generation(ids, [-0.1 * (1 + (k + turn) % 7) for k in range(len(ids))], "stop", tags)


def two_segment_result(codec: ChatCodec, reward: float = 1.0, versions: bool = False) -> EpisodeResult:
    first = Trajectory(prompt_ids=codec.prompt_ids(TASK), reason="start")
    _generate(first, codec, REPLIES[0], 0, versions)
    tool = [{"role": "user", "content": "calc.py: return a - b"}]
    first.add_context(codec.continuation_ids(tool), role="user")
    _generate(first, codec, REPLIES[1], 1, versions)
    # The harness dropped the tool result: no segment extends this history, so it is rendered afresh.
    rewritten = [
        *TASK,
        {"role": "assistant", "content": REPLIES[0]},
        {"role": "assistant", "content": REPLIES[1]},
    ]
    second = Trajectory(prompt_ids=codec.prompt_ids(rewritten), reason="rewritten")
    _generate(second, codec, REPLIES[2], 2, versions)
    for t in (first, second):
        t.validate()
    messages: list[dict[str, Any]] = [*rewritten, {"role": "assistant", "content": REPLIES[2]}]
    metrics = {"turns": 3, "prompt_tokens": len(second.prompt_ids), "model_s": 0.3, "wall_s": 1.0}
    return EpisodeResult(
        messages, [first, second], ExitReason.FINISHED, Reward(reward, resolved=reward > 0), metrics
    )


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
