"""Context policies with the real SmolLM2 generating (LocalEngine, the session `smol_engine`), the
SWE calc task in a real bubblewrap sandbox, and a context cap forced a couple of hundred tokens
above the task's own prompt: `window` and `summarize` condense at least once and end by something
other than `context_limit`; `none` ends `context_limit` on the same setup. Greedy decoding and
short turns keep the three episodes (run at once, batched by the engine) to about a minute
on a CPU."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent_helpers import make_swe_task_file
from conftest import needs_bwrap
from uniagent.agent import AgentConfig, EpisodeResult, ExitReason
from uniagent.models.base import SamplingParams
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.tasks import load_tasks, run_episode
from uniagent.tasks.swe import SweTask

pytestmark = needs_bwrap

TURN_TOKENS = 24


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> SweTask:
    [t] = load_tasks(str(make_swe_task_file(Path(tmp_path_factory.mktemp("ctx")))))
    assert isinstance(t, SweTask)
    return t


def smol(engine, codec, name: str) -> TokenChatModel:  # type: ignore[no-untyped-def]
    sampling = SamplingParams(temperature=0.0, max_tokens=TURN_TOKENS)
    return TokenChatModel(engine, codec, get_parser("hermes"), sampling, request_id=f"ctx-{name}")


def config(policy: str, head: int) -> AgentConfig:
    """Condense 150 tokens above the task's prompt, keeping no turn verbatim (a turn here is about
    60 tokens: the reply and the format-error note), so the note or summary leaves room for two
    more turns; the cap leaves room for the summary request and a 32-token summary after that."""
    context = {"policy": policy, "keep_turns": 0, "compress_at_tokens": head + 150, "summary_max_tokens": 32}
    return AgentConfig(max_turns=8, max_format_errors=10, max_context_tokens=head + 340, context=context)


def check(res: EpisodeResult) -> None:
    """Each segment is exact and valid (no context token with mask 1); the model tokens across
    segments are exactly the turns' and the summaries' (none lost, none counted twice); each
    condensed segment starts from the condensed history's own render."""
    for seg in res.segments:
        seg.validate()
    summary = res.metrics.get("summary_tokens", 0)
    assert sum(s.num_model_tokens for s in res.segments) == res.metrics["completion_tokens"] + summary
    markers = [m for m in res.messages if m["role"] == "context"]
    assert [s.reason for s in res.segments] == ["start"] + ["condensed"] * len(markers)
    for marker, seg in zip(markers, res.segments[1:], strict=True):
        assert len(seg.prompt_ids) == marker["condensed"]["tokens_after"]


async def test_real_smollm2_window_and_summarize_make_room_where_none_hits_the_cap(
    task: SweTask, smol_engine, codec
) -> None:  # type: ignore[no-untyped-def]
    none = await run_episode(task, smol(smol_engine, codec, "probe"), AgentConfig(max_turns=1))
    head = len(none.segments[0].prompt_ids)

    # The three episodes at once: the local engine decodes them in one batch.
    none, window, summarize = await asyncio.gather(
        *(
            run_episode(task, smol(smol_engine, codec, p), config(p, head))
            for p in ("none", "window", "summarize")
        )
    )
    assert none.exit_reason == ExitReason.CONTEXT_LIMIT, (none.exit_reason, none.metrics)
    for policy, res in (("window", window), ("summarize", summarize)):
        assert res.exit_reason not in (ExitReason.CONTEXT_LIMIT, ExitReason.INTERNAL_ERROR), (
            policy,
            res.error,
        )
        assert res.metrics.get("context_compressions", 0) >= 1, (policy, res.metrics)
        check(res)
    assert summarize.metrics.get("summary_tokens", 0) > 0, summarize.metrics
