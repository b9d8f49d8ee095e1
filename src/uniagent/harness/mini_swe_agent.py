"""Black-box harness episodes: a third-party agent talks to a gateway session, acts in our sandbox.

mini-swe-agent runs unmodified: its own `DefaultAgent`, its own `LitellmModel` pointed at the
session's OpenAI base URL through its config (`model_name: openai/...`, `model_kwargs.api_base`),
its own prompts and its own way of finishing (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`). Only
its *environment* is ours: `SandboxEnvironment` runs each command in the episode's sandbox, the
way mini's docker environment runs each in `docker exec` (a fresh subshell in the workdir).

`MiniSweAgent` is the registry's `mini-swe-agent[:CONFIG]` agent (agent/registry.py): its per-run
resource is a `HarnessGateway` over the run's engine (started by `start`, one per run or per Ray
actor), and its `run` is one episode in the sandbox `run_episode` set up. The episode is the same as
a ReAct one everywhere else: the task's sandbox and setup, one `ExitReason`, an `EpisodeResult`
whose segments are the gateway's token record of the conversation, one per chain, and grading by
`run_episode` after the agent returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
import traceback
import uuid
from typing import Any

from uniagent.agent.base import AgentBase, Episode, TaskView
from uniagent.agent.config import AgentConfig
from uniagent.agent.result import EpisodeResult, ExitReason
from uniagent.errors import ConfigError, SandboxDeadError, SandboxError
from uniagent.gateway.app import Gateway
from uniagent.gateway.server import GatewayServer
from uniagent.gateway.sessions import Session
from uniagent.harness.mini_environment import SandboxEnvironment
from uniagent.harness.session import (
    NEEDS_TOKENS,
    attach_segments,
    finish_session,
    open_session,
    task_text,
)
from uniagent.models.base import TokenEngine
from uniagent.sandbox.base import Sandbox
from uniagent.tasks.base import Task
from uniagent.tasks.episode import run_episode
from uniagent.tasks.episode_setup import failed_result
from uniagent.tokens import ChatCodec

log = logging.getLogger(__name__)

HARNESSES = ("mini-swe-agent",)

# mini-swe-agent exit statuses -> ours. Anything else is an exception it raised.
MINI_EXITS = {
    "Submitted": ExitReason.FINISHED,
    "LimitsExceeded": ExitReason.MAX_TURNS,
    "TimeExceeded": ExitReason.TIMEOUT_BUDGET,
    "RepeatedFormatError": ExitReason.FORMAT_ERRORS,
    "TimeoutBudget": ExitReason.TIMEOUT_BUDGET,
}


def parse_kind(kind: str) -> tuple[str, str | None]:
    """`mini-swe-agent` or `mini-swe-agent:CONFIG` (a mini config name or YAML path)."""
    name, _, config = kind.partition(":")
    if name not in HARNESSES:
        raise ConfigError(f"agent kind {kind!r}: harnesses are {', '.join(HARNESSES)} (or `react`)")
    return name, config or None


def _quiet_imports() -> None:
    """mini-swe-agent prints a banner on import and litellm fetches a price list; neither is wanted."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # mini retries a failing model call 10 times with up to 60 s waits; an engine failure should
    # end the episode (model_error) in seconds, not minutes.
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")


def import_mini() -> None:
    """Import mini-swe-agent and litellm (seconds: do it once, off the event loop)."""
    _quiet_imports()
    import litellm
    import minisweagent.agents.default  # noqa: F401

    litellm.suppress_debug_info = True  # no "Provider List" banners for our unpriced model name


def mini_config(spec: str | None) -> dict[str, Any]:
    """A mini-swe-agent config (its bundled `mini.yaml` by default) as a dict."""
    _quiet_imports()
    import yaml
    from minisweagent.config import get_config_path

    try:
        path = get_config_path(spec or "mini.yaml")
    except FileNotFoundError as exc:
        raise ConfigError(f"mini-swe-agent config {spec!r}: {exc}") from None
    return yaml.safe_load(path.read_text()) or {}


class HarnessGateway:
    """One in-process gateway over the run's engine, serving every harness episode of a run."""

    def __init__(
        self, kind: str, engine: TokenEngine | None, codec: ChatCodec | None, token: str | None = None
    ) -> None:
        if engine is None or codec is None:
            raise ConfigError(
                f"agent kind {kind!r} runs through the gateway and needs a token engine: "
                "use a token-level model.spec (local, local:PATH, replay:FILE, vllm:URL, ...)"
            )
        self.kind, self.harness_config = parse_kind(kind)
        self.config = mini_config(self.harness_config)
        self.token = token or uuid.uuid4().hex
        self.gateway = Gateway(engine, codec, token=self.token, idle_timeout_s=24 * 3600)
        self.server = GatewayServer(self.gateway)

    @classmethod
    async def start(
        cls, kind: str, engine: TokenEngine | None, codec: ChatCodec | None, token: str | None = None
    ) -> HarnessGateway:
        self = cls(kind, engine, codec, token)
        await asyncio.to_thread(import_mini)
        await self.server.start()
        return self

    async def close(self) -> None:
        await self.server.stop()

    async def __aenter__(self) -> HarnessGateway:
        await asyncio.to_thread(import_mini)
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run_episode(
        self,
        task: Task,
        model: Any,
        agent: AgentConfig | None = None,
        sandbox: dict[str, Any] | None = None,
    ) -> EpisodeResult:
        """The one episode entry (`tasks.episode.run_episode`) with this gateway's harness as the
        agent; `model` is the episode's `TokenChatModel`."""
        return await run_episode(task, model, agent, sandbox, agent=MiniSweAgent.over(self))


class MiniSweAgent(AgentBase):
    """The `mini-swe-agent[:CONFIG]` agent (CONFIG: a mini config name or YAML path; default
    mini's bundled `mini.yaml`). Each episode is a session of the gateway `start` opens over the
    run's engine; `model` must be a `TokenChatModel` (its sampling, parser and request id are the
    session's)."""

    name = "mini-swe-agent"

    def __init__(self, config: str | None = None) -> None:
        self.kind = f"{self.name}:{config}" if config else self.name
        self.harness: HarnessGateway | None = None

    @classmethod
    def over(cls, harness: HarnessGateway) -> MiniSweAgent:
        """The agent over an already started gateway (its owner closes it)."""
        self = cls.__new__(cls)
        self.kind, self.harness = harness.kind, harness
        return self

    async def start(self, engine: TokenEngine | None, codec: ChatCodec | None) -> None:
        self.harness = await HarnessGateway.start(self.kind, engine, codec)

    async def close(self) -> None:
        if self.harness is not None:
            await self.harness.close()
            self.harness = None

    async def run(self, episode: Episode) -> EpisodeResult:
        if self.harness is None:
            raise RuntimeError("MiniSweAgent.run before start()")
        return await run_harness_episode(self.harness, episode)


async def run_harness_episode(harness: HarnessGateway, episode: Episode) -> EpisodeResult:
    """One harness episode in the sandbox `run_episode` set up (and stops)."""
    task, sb, model, metrics = episode.task, episode.sandbox, episode.model, episode.metrics
    agent = episode.config
    spec = model.session_spec()
    if spec is None:
        return failed_result(task, ExitReason.INTERNAL_ERROR, NEEDS_TOKENS, metrics)
    session: Session | None = None
    try:
        try:
            uname = await sb.exec("uname -s; uname -r; uname -v; uname -m", timeout=30)
        except (SandboxError, OSError, TimeoutError) as exc:
            return failed_result(task, ExitReason.SANDBOX_DEAD, f"sandbox start/setup: {exc}", metrics)
        session = open_session(harness.gateway, spec, agent, task, harness.kind)
        parts = [*uname.output.splitlines(), "", "", "", ""][:4]
        template_vars = dict(zip(("system", "release", "version", "machine"), parts, strict=True))
        result = await _run_mini(harness, session, task, sb, agent, template_vars, metrics)
        finish_session(session)
        return result
    finally:
        if session is not None:
            harness.gateway.sessions.close(session, "deleted")


async def _run_mini(
    harness: HarnessGateway,
    session: Session,
    task: TaskView,
    sb: Sandbox,
    agent_cfg: AgentConfig,
    template_vars: dict[str, Any],
    metrics: dict[str, Any],
) -> EpisodeResult:
    import_mini()
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models import get_model

    config = harness.config
    loop = asyncio.get_running_loop()
    model_cfg = dict(config.get("model") or {})
    model_cfg.update(
        model_name=f"openai/{harness.gateway.model_name}",
        model_kwargs={
            **(model_cfg.get("model_kwargs") or {}),
            "api_base": harness.server.session_url(session.id),
            "api_key": harness.token,
            "drop_params": True,
            "timeout": max(60.0, float(agent_cfg.wall_time_s or 0) or 3600.0),
        },
        cost_tracking="ignore_errors",
    )
    model_cfg.pop("model_class", None)
    env_cfg = config.get("environment") or {}
    env = SandboxEnvironment(
        sb,
        loop,
        template_vars=template_vars,
        timeout_budget=agent_cfg.timeout_budget,
        cwd=sb.workdir,
        env={str(k): str(v) for k, v in (env_cfg.get("env") or {}).items()},
        timeout=agent_cfg.command_timeout_s,  # not int(): 0.5 s is 0.5 s, not 0
    )
    agent_kwargs = {
        **(config.get("agent") or {}),
        "step_limit": agent_cfg.max_turns,
        "cost_limit": 0.0,
        "wall_time_limit_seconds": int(agent_cfg.wall_time_s or 0),
        "max_consecutive_format_errors": agent_cfg.max_format_errors,
        "output_path": None,
    }
    text = task_text(task)
    holder: dict[str, Any] = {}

    def work() -> dict[str, Any]:
        mini = DefaultAgent(get_model(config=model_cfg), env, **agent_kwargs)
        holder["agent"] = mini
        return mini.run(text)

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"mini-{task.instance_id}")
    started = time.perf_counter()
    info: dict[str, Any] = {}
    error: BaseException | None = None
    future = loop.run_in_executor(pool, work)
    limit = (agent_cfg.wall_time_s + agent_cfg.command_timeout_s + 30) if agent_cfg.wall_time_s else None
    try:
        info = await asyncio.wait_for(asyncio.shield(future), limit)
    except TimeoutError:
        error = TimeoutError("the harness overran the episode's wall time")
        metrics["budget_hit"] = "wall_time"
    except asyncio.CancelledError:
        harness.gateway.sessions.close(session, "aborted")  # its next model call fails at once
        raise
    except BaseException as exc:
        error = exc
    finally:
        if not future.done():
            harness.gateway.sessions.close(session, "aborted")
            await asyncio.wait({future}, timeout=agent_cfg.command_timeout_s + 30)
        pool.shutdown(wait=False)
    metrics["harness_s"] = time.perf_counter() - started
    mini = holder.get("agent")
    messages = [
        {k: v for k, v in m.items() if k != "extra"}
        for m in (mini.messages if mini is not None else [])
        if m.get("role") != "exit"
    ]
    status = str(info.get("exit_status", "")) if error is None else type(error).__name__
    metrics["harness_exit_status"] = status
    metrics["tool_calls"] = env.commands
    metrics["tool_timeouts"] = env.timeouts
    metrics["tool_errors"] = env.errors
    metrics["format_errors"] = sum(
        1
        for m in (mini.messages if mini else [])
        if (m.get("extra") or {}).get("interrupt_type") == "FormatError"
    )
    reason, err_text = _exit_reason(error, status, session, sb)
    if error is not None and reason in (ExitReason.INTERNAL_ERROR, ExitReason.MODEL_ERROR):
        err_text = f"{err_text}\n{''.join(traceback.format_exception(error, limit=6))}"
    if reason == ExitReason.SANDBOX_DEAD and not await sb.alive():
        err_text = err_text or "the sandbox died"
    result = EpisodeResult(messages, None, reason, None, metrics, error=err_text)
    if reason == ExitReason.FINISHED:
        result.answer = str(info.get("submission", "")).strip() or None
    await attach_segments(session, result)
    return result


def _exit_reason(
    error: BaseException | None, status: str, session: Session, sb: Sandbox
) -> tuple[ExitReason, str | None]:
    context_full = session.context_full or any(s.ended for s in session.segments)
    if error is None:
        reason = MINI_EXITS.get(status, ExitReason.INTERNAL_ERROR)
        if reason == ExitReason.FORMAT_ERRORS and context_full:
            return ExitReason.CONTEXT_LIMIT, None
        return reason, None if reason != ExitReason.INTERNAL_ERROR else f"unknown harness exit {status!r}"
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, SandboxDeadError):
        return ExitReason.SANDBOX_DEAD, text
    if isinstance(error, TimeoutError):
        return ExitReason.TIMEOUT_BUDGET, text
    if context_full or "ContextWindowExceeded" in type(error).__name__:
        return ExitReason.CONTEXT_LIMIT, None
    if session.state != "open":
        return ExitReason.CANCELLED, text
    module = type(error).__module__ or ""
    if module.startswith(("litellm", "openai", "httpx")):
        return ExitReason.MODEL_ERROR, text
    return ExitReason.INTERNAL_ERROR, text
