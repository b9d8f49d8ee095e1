"""AgentInteraction: the ReAct loop shared by evaluation and training.

query the model -> parse tool calls -> run them in order in the sandbox -> one observation
per call -> repeat, until a tool ends the episode or a budget runs out. The loop never lets
an exception escape: every way out is one `ExitReason`, so the runner can always store the
episode and the trainer can always tell policy failures from infrastructure failures.

Context management (`agent.context`, agent/context/): before a turn whose token segment has
reached the compression threshold, the episode's policy condenses the history the model sees and
the model starts a new segment (reason "condensed"). The episode's stored `messages` keep the
full history: everything the model saw before a compression, then a marker message
(`role: "context"`, its `content` the note the model was given, `condensed` the figures), then
what came after. The episode ends `context_limit` only when the policy cannot make room.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable
from typing import Any

from uniagent.agent.config import AgentConfig
from uniagent.agent.context import Request, create_policy
from uniagent.agent.observation import format_error_message, tool_message
from uniagent.agent.result import EpisodeResult, ExitReason
from uniagent.errors import EngineError, SandboxDeadError, SandboxError
from uniagent.models.base import ChatModel
from uniagent.sandbox.base import Sandbox
from uniagent.tokens.drift import episode_drift
from uniagent.tools.base import Tool, ToolResult

log = logging.getLogger(__name__)


class AgentInteraction:
    """One episode's loop. Build one per episode (it holds the model's per-episode state)."""

    def __init__(
        self,
        model: ChatModel,
        tools: list[Tool],
        config: AgentConfig | None = None,
        summarizer: ChatModel | None = None,
    ) -> None:
        """`summarizer`: another model for the `summarize` policy (default: the policy model)."""
        self.model = model
        self.config = config or AgentConfig()
        self.policy = create_policy(self.config.context)
        self.summarizer = summarizer
        self._threshold = self.config.compress_threshold()
        self._archive: list[dict[str, Any]] = []  # stored messages of the views condensed so far
        self._fresh = 0  # history[self._fresh:] is not in the archive yet
        self._head = 0  # the task's messages (kept by every policy)
        self._pending: int | None = None  # a condensed history's tokens until its segment starts
        # One setting bounds every command the model runs, whichever tool runs it.
        tools = [t.with_command_timeout(self.config.command_timeout_s) for t in tools]
        self.tools = {t.name: t for t in tools}
        self.specs = [t.spec() for t in tools]

    async def run(
        self,
        messages: list[dict[str, Any]],
        sandbox: Sandbox,
    ) -> EpisodeResult:
        """One episode in `sandbox`; not graded: `run_episode` grades every agent's episode
        after the agent returns (`uniagent.tasks.grading`), so there is one scoring path."""
        history = list(messages)
        self._head = len(messages)
        metrics: dict[str, Any] = {
            "turns": 0,
            "tool_calls": 0,
            "tool_errors": 0,
            "tool_timeouts": 0,
            "format_errors": 0,
            "model_s": 0.0,
            "tools_s": 0.0,
            "verifier_s": 0.0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }
        started = time.perf_counter()
        final: ToolResult | None = None
        error: str | None = None
        exit_reason: ExitReason
        try:
            exit_reason, final = await self._loop(history, sandbox, metrics, started)
        except asyncio.CancelledError:
            exit_reason, error = ExitReason.CANCELLED, "cancelled"
        except SandboxDeadError as exc:
            exit_reason, error = ExitReason.SANDBOX_DEAD, str(exc)
        except _ModelFailure as exc:
            exit_reason, error = ExitReason.MODEL_ERROR, str(exc)
        except Exception as exc:  # a bug of ours: recorded, never trained on
            log.exception("episode failed inside the agent loop")
            exit_reason, error = ExitReason.INTERNAL_ERROR, f"{exc!r}\n{traceback.format_exc(limit=8)}"
        result = EpisodeResult(
            messages=self._archive + history[self._fresh :],
            segments=None,
            exit_reason=exit_reason,
            reward=None,
            metrics=metrics,
            patch=final.patch if final else None,
            answer=final.answer if final else None,
            error=error,
        )
        # A full render and tokenization of the whole episode (drift): CPU work that grows with
        # the episode, so not on the event loop that serves every other episode.
        result.segments = await asyncio.to_thread(self._finish_segments, history, result)
        metrics["wall_s"] = time.perf_counter() - started
        return result

    async def _loop(
        self, history: list[dict[str, Any]], sandbox: Sandbox, metrics: dict[str, Any], started: float
    ) -> tuple[ExitReason, ToolResult | None]:
        cfg = self.config
        bad_in_row = 0
        while True:
            if metrics["turns"] >= cfg.max_turns:
                return ExitReason.MAX_TURNS, None
            if cfg.wall_time_s and time.perf_counter() - started >= cfg.wall_time_s:
                metrics["budget_hit"] = "wall_time"
                return ExitReason.TIMEOUT_BUDGET, None
            if self._threshold is not None and self.model.context_tokens >= self._threshold:
                if not await self._condense(history, metrics, started):
                    metrics["context_limit_reason"] = "the context policy could not make room"
                    return ExitReason.CONTEXT_LIMIT, None
            elif self._context_full():
                return ExitReason.CONTEXT_LIMIT, None
            turn = await self._query(history, metrics, started)
            metrics["turns"] += 1
            history.append(turn.message)
            if turn.format_error or not turn.tool_calls:
                if turn.finish_reason == "length" and self._context_full() and self._threshold is None:
                    return ExitReason.CONTEXT_LIMIT, None  # (a policy condenses before the next turn)
                metrics["format_errors"] += 1
                bad_in_row += 1
                if bad_in_row >= cfg.max_format_errors:
                    return ExitReason.FORMAT_ERRORS, None
                history.append(format_error_message(turn.format_error))
                continue
            bad_in_row = 0
            done: ToolResult | None = None
            for i, call in enumerate(turn.tool_calls):
                result = await self._run_tool(call.name, call.arguments, sandbox, metrics)
                history.append(tool_message(call, result.text, cfg.observation_max_chars))
                if result.done:
                    done = result
                    skipped = len(turn.tool_calls) - i - 1
                    if skipped:
                        metrics["calls_skipped_after_end"] = skipped
                    break
            if done is not None:
                return ExitReason.FINISHED, done
            if metrics["tool_timeouts"] >= cfg.timeout_budget:
                metrics["budget_hit"] = "tool_timeouts"
                return ExitReason.TIMEOUT_BUDGET, None

    def _context_now(self) -> int:
        """The next prompt's tokens as far as known: a condensed history's own size until its
        segment starts, else the current segment's."""
        return self._pending if self._pending is not None else self.model.context_tokens

    def _context_full(self) -> bool:
        limit = self.config.max_context_tokens
        return bool(limit and self._context_now() >= limit)

    async def _condense(self, history: list[dict[str, Any]], metrics: dict[str, Any], started: float) -> bool:
        """Let the policy condense `history` in place; False when it cannot make room."""
        assert self._threshold is not None
        before = self.model.context_tokens
        limit = self.config.max_context_tokens
        request = Request(
            history=list(history),
            head=self._head,
            noted=bool(metrics.get("context_compressions")),
            model=self.model,
            tools=self.specs,
            target=self._threshold,
            room=limit - before if limit else None,
            summarizer=self.summarizer,
        )
        out = await self._model_call(self.policy.condense(request), metrics, started)
        if out is None:
            return False
        self.model.begin_segment("condensed")
        figures = {
            "policy": self.policy.name,
            "segment": len(self.model.segments),
            "dropped_turns": out.dropped_turns,
            "tokens_before": before,
            "tokens_after": out.tokens,
        }
        marker = {"role": "context", "content": out.note, "condensed": figures}
        self._archive += [*history[self._fresh :], *out.transcript, marker]
        history[:] = out.history
        self._fresh = len(history)
        self._pending = out.tokens
        metrics["context_compressions"] = metrics.get("context_compressions", 0) + 1
        metrics.setdefault("context_tokens_before", []).append(before)
        metrics.setdefault("context_tokens_after", []).append(out.tokens)
        for key, value in {"context_dropped_turns": out.dropped_turns, **out.metrics}.items():
            metrics[key] = metrics.get(key, 0) + value
        return True

    async def _query(self, history: list[dict[str, Any]], metrics: dict[str, Any], started: float) -> Any:
        query = self.model.query(history, self.specs, max_tokens=self._turn_cap())
        turn = await self._model_call(query, metrics, started)
        self._pending = None
        metrics["prompt_tokens"] = max(metrics["prompt_tokens"], turn.prompt_tokens)
        metrics["completion_tokens"] += turn.completion_tokens
        return turn

    async def _model_call(self, call: Awaitable[Any], metrics: dict[str, Any], started: float) -> Any:
        """A model call (a turn, or a policy's summary) within the episode's wall time; an engine
        failure becomes `_ModelFailure` (model_error)."""
        cfg = self.config
        remaining = None
        if cfg.wall_time_s:
            remaining = max(0.1, cfg.wall_time_s - (time.perf_counter() - started))
        t0 = time.perf_counter()
        try:
            return await asyncio.wait_for(call, remaining)
        except TimeoutError:
            raise _ModelFailure("the model did not answer within the episode's wall time") from None
        except (EngineError, OSError) as exc:
            raise _ModelFailure(f"{type(exc).__name__}: {exc}") from exc
        finally:
            metrics["model_s"] += time.perf_counter() - t0

    def _turn_cap(self) -> int | None:
        """This turn's max_tokens: what the context cap leaves (the per-turn cap is the model's own
        sampling, `model.max_tokens`)."""
        if self.config.max_context_tokens:
            return max(1, self.config.max_context_tokens - self._context_now())
        return None

    async def _run_tool(
        self, name: str, arguments: dict[str, Any], sandbox: Sandbox, metrics: dict[str, Any]
    ) -> ToolResult:
        metrics["tool_calls"] += 1
        tool = self.tools.get(name)
        if tool is None:
            metrics["tool_errors"] += 1
            known = ", ".join(sorted(self.tools))
            return ToolResult(f"There is no tool named {name!r}. The tools are: {known}.", status="error")
        t0 = time.perf_counter()
        try:
            result = await tool.call(arguments, sandbox)
        except SandboxDeadError:
            raise
        except SandboxError as exc:
            if not await sandbox.alive():
                raise SandboxDeadError(str(exc)) from exc
            result = ToolResult(f"The tool failed: {exc}", status="error")
        finally:
            metrics["tools_s"] += time.perf_counter() - t0
        if result.status == "timeout":
            metrics["tool_timeouts"] += 1
        elif result.status == "error":
            metrics["tool_errors"] += 1
        return result

    def _finish_segments(self, history: list[dict[str, Any]], result: EpisodeResult) -> list[Any]:
        if not self.model.segments:
            return []
        # The model never saw what came after its last turn (e.g. submit's reply).
        last = max((i for i, m in enumerate(history) if m.get("role") == "assistant"), default=-1)
        try:
            segments = self.model.finish(history[: last + 1], self.specs)
        except Exception as exc:  # the episode stands; its token record is what failed
            log.warning("could not finish the token trajectory: %s", exc)
            result.metrics["trajectory_error"] = str(exc)
            return list(self.model.segments)
        result.metrics["drift"] = episode_drift(segments).index  # the stored row's rule
        if len(segments) > 1:
            result.metrics["segments"] = len(segments)
        return segments


class _ModelFailure(Exception):
    """The model endpoint or engine failed (after its own retries)."""
