"""Black-box CLI harnesses (Claude Code, Codex) run *inside* the episode's sandbox.

A CLI runs its tools where it runs, so the real binary runs in the episode's bubblewrap sandbox
(the `local` backend), not on the host. The only way out of the sandbox is one unix socket:

- the pinned CLIs live in one install dir (`scripts/install-clis.sh`, default `.cache/npm-clis`),
  bound read-only into the sandbox (`LocalConfig.ro_binds`, added by the Agent hook
  `prepare_sandbox` before the sandbox starts);
- each episode gets its own host directory, also bound read-only (a unix socket needs no write
  permission on its mount to be connected to), holding `gw.sock` and the CLI's config files;
- `SessionSocket` serves the gateway's app on that socket through `ScopedApp`, which admits only
  requests to this episode's session carrying this episode's random token (`x-api-key` or a
  bearer token), so a CLI cannot reach another session even if it found its socket; it also
  counts model calls and answers past the turn budget with the protocol's own context error
  (Codex has no max-turns flag), and notes the gateway's server errors (model_error).

The sandbox keeps its own network namespace (no network, a fresh loopback): Claude Code talks to
the socket directly (`ANTHROPIC_UNIX_SOCKET`); Codex only speaks TCP, so `forward.py` relays a
loopback port inside the sandbox's namespace to the socket. A probe of any other port fails.

What a harness adds (`CliAgent` subclasses, one module each): the CLI's command line and
environment, its config files, and how its output says it ended. The rest is shared with
the harness agents (harness/session.py): a gateway session per episode with trusted
sampling, finalize, `attach_segments`. Grading is not the agent's: `run_episode` grades after
`run` returns, as for every agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from uniagent.agent.base import AgentBase, Episode
from uniagent.agent.result import EpisodeResult, ExitReason
from uniagent.config import first_error
from uniagent.errors import ConfigError, SandboxDeadError, SandboxError
from uniagent.gateway.app import Gateway
from uniagent.gateway.server import InProcessServer
from uniagent.gateway.sessions import Session
from uniagent.harness.session import NEEDS_TOKENS, attach_segments, finish_session, open_session
from uniagent.models.base import TokenEngine
from uniagent.sandbox.config import SandboxConfig, type_of
from uniagent.sandbox.procs import quote
from uniagent.tasks.episode_setup import failed_result
from uniagent.tokens import ChatCodec

SOCKET = "gw.sock"
SESSION_DIR_PREFIX = "uniagent-gw-"
MODEL_CALLS = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


def cli_dir() -> Path | None:
    """Where `scripts/install-clis.sh` put the CLIs: $UNIAGENT_NPM_CLIS, else the checkout's
    `.cache/npm-clis`; None when neither holds an install."""
    env = os.environ.get("UNIAGENT_NPM_CLIS")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[3] / ".cache" / "npm-clis")
    for path in candidates:
        if (path / "node_modules" / ".bin").is_dir():
            return path.resolve()
    return None


def require_cli_dir(agent: str) -> Path:
    path = cli_dir()
    if path is None:
        raise ConfigError(
            f"agent kind {agent!r} needs the pinned harness CLIs: run `make clis` "
            "(or scripts/install-clis.sh; set UNIAGENT_NPM_CLIS to use another install dir)"
        )
    return path


# -- the session's socket ------------------------------------------------------------------


class ScopedApp:
    """The gateway's ASGI app as one session sees it: its paths, its token, its turn budget."""

    def __init__(self, app: Any, session_id: str, token: str, max_calls: int | None) -> None:
        self.app = app
        self.prefix = f"/sessions/{session_id}"
        self.token = token
        self.max_calls = max_calls
        self.calls = 0  # model calls admitted
        self.refused = 0  # model calls answered with the turn-budget error
        self.server_errors: list[int] = []  # 5xx statuses the gateway answered (engine failures)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        key = headers.get(b"x-api-key", b"").decode(errors="replace").strip()
        scheme, _, value = headers.get(b"authorization", b"").decode(errors="replace").partition(" ")
        given = key or (value.strip() if scheme.lower() == "bearer" else "")
        return bool(given) and hmac.compare_digest(given, self.token)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        headers = dict(scope.get("headers") or [])
        if not (path == self.prefix or path.startswith(self.prefix + "/")):
            await _reply(send, 404, {"error": {"message": "not this session's socket", "type": "not_found"}})
            return
        if not self._authorized(headers):
            await _reply(
                send, 401, {"error": {"message": "wrong session token", "type": "authentication_error"}}
            )
            return
        if scope["method"] == "POST" and path.endswith(MODEL_CALLS):
            if self.max_calls is not None and self.calls >= self.max_calls:
                self.refused += 1
                await _reply(send, 400, budget_error(path, self.max_calls))
                return
            self.calls += 1
        # The gateway behind serves only this process's sockets: its own token is not used.
        inner = dict(scope)
        inner["headers"] = [
            (k, v) for k, v in scope.get("headers") or [] if k not in (b"authorization", b"x-api-key")
        ]

        async def watch(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 500:
                self.server_errors.append(message["status"])
            await send(message)

        await self.app(inner, receive, watch)


def budget_error(path: str, limit: int) -> dict[str, Any]:
    """Past the turn budget: the context error each CLI understands and does not retry."""
    message = f"prompt is too long: the episode's budget of {limit} model calls is spent"
    if path.endswith("/v1/messages"):
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return {
        "error": {
            "message": f"Your input exceeds the context window of this model. ({message})",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }


async def _reply(send: Any, status: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


class SessionSocket(InProcessServer):
    """uvicorn serving a `ScopedApp` on `<dir>/gw.sock` in this event loop."""

    def __init__(self, directory: Path, app: ScopedApp) -> None:
        import uvicorn

        self.path = directory / SOCKET
        self.app = app
        config = uvicorn.Config(
            app, uds=str(self.path), lifespan="off", log_level="warning", access_log=False,
            timeout_keep_alive=300,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self._task = None

    async def start(self) -> SessionSocket:
        await self._serve(f"the session socket {self.path}", SandboxError)
        return self


# -- the agent -------------------------------------------------------------------------------


class CliAgent(AgentBase):
    """An agent that runs a CLI harness in the episode's sandbox against its own gateway session.

    Subclasses give `name`, `command` (a bash script that runs the CLI in the workdir; its
    stdout is what `outcome` reads), `files` (config files for the session dir) and `outcome`."""

    name: ClassVar[str] = ""
    protocol: ClassVar[str] = ""
    presets: ClassVar[dict[str, list[str]]] = {}  # --agent NAME:PRESET -> the CLI's flags

    def __init__(self, config: str | None = None) -> None:
        self.kind = f"{self.name}:{config}" if config else self.name
        self.cli, self.flags = cli_config(self.name, config, self.presets)
        self.gateway: Gateway | None = None
        self.install: Path | None = None
        self.root: Path | None = None  # per-run dir of per-episode session dirs

    async def start(self, engine: TokenEngine | None, codec: ChatCodec | None) -> None:
        if engine is None or codec is None:
            raise ConfigError(
                f"agent kind {self.kind!r} runs through the gateway and needs a token engine: "
                "use a token-level model.spec (local, local:PATH, replay:FILE, vllm:URL, ...)"
            )
        self.install = require_cli_dir(self.name)
        self.gateway = Gateway(engine, codec, token=None, idle_timeout_s=24 * 3600)
        self.root = Path(tempfile.mkdtemp(prefix=f"{SESSION_DIR_PREFIX}{os.getpid()}-"))

    async def close(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        self.gateway = None

    # -- the sandbox: the Agent hook run_episode calls before the sandbox starts -------------
    def prepare_sandbox(self, config: SandboxConfig) -> SandboxConfig:
        """The run's sandbox plus the CLI install and a fresh session dir, both read-only."""
        if self.root is None or self.install is None:
            raise RuntimeError(f"{type(self).__name__}.prepare_sandbox before start()")
        if type_of(config) != "local":
            raise ConfigError(
                f"agent kind {self.name!r} runs its CLI inside a local (bubblewrap) sandbox; "
                f"this task's sandbox is {type_of(config)!r}"
            )
        session_dir = Path(tempfile.mkdtemp(dir=self.root))
        binds = [*getattr(config, "ro_binds", []), str(self.install), str(session_dir)]
        return config.model_copy(update={"ro_binds": binds})

    def _session_dir(self, episode: Episode) -> Path | None:
        binds = getattr(episode.sandbox.config, "ro_binds", None) or []
        root = str(self.root)
        return next((Path(b) for b in binds if str(b).startswith(root + "/")), None)

    # -- what a harness defines ------------------------------------------------------------
    def files(self, session_dir: Path, base_url: str, episode: Episode) -> dict[str, str]:
        return {}

    def command(self, session_dir: Path, session: Session, token: str, episode: Episode) -> str:
        raise NotImplementedError

    def outcome(self, stdout: str, rc: int | None) -> tuple[ExitReason | None, str | None]:
        """(a reason the CLI's own output states, or None; its final answer)."""
        return None, None

    # -- one episode -------------------------------------------------------------------------
    async def run(self, episode: Episode) -> EpisodeResult:
        task, model, metrics, agent = episode.task, episode.model, episode.metrics, episode.config
        if self.gateway is None or self.install is None:
            raise RuntimeError(f"{type(self).__name__}.run before start()")
        spec = model.session_spec()
        if spec is None:
            return failed_result(task, ExitReason.INTERNAL_ERROR, NEEDS_TOKENS, metrics)
        session_dir = self._session_dir(episode)
        if session_dir is None:
            return failed_result(
                task,
                ExitReason.INTERNAL_ERROR,
                f"the sandbox has no session dir of {self.name}: run it through run_episode(agent=...)",
                metrics,
            )
        session = open_session(self.gateway, spec, agent, task, self.kind)
        token = secrets.token_hex(16)
        scoped = ScopedApp(self.gateway.app, session.id, token, agent.max_turns or None)
        sock = SessionSocket(session_dir, scoped)
        try:
            await sock.start()
            for name, text in self.files(session_dir, f"/sessions/{session.id}", episode).items():
                (session_dir / name).write_text(text)
            result = await self._run_cli(episode, session, scoped, session_dir, token)
            finish_session(session)
            return result
        finally:
            await sock.stop()
            self.gateway.sessions.close(session, "deleted")
            shutil.rmtree(session_dir, ignore_errors=True)

    async def _run_cli(
        self, episode: Episode, session: Session, scoped: ScopedApp, session_dir: Path, token: str
    ) -> EpisodeResult:
        task, sb, metrics, agent = episode.task, episode.sandbox, episode.metrics, episode.config
        wall = float(agent.wall_time_s or 3600)
        out = f"/tmp/uniagent-{self.name}.out"
        line = self.command(session_dir, session, token, episode)
        script = (
            f"cd {quote(sb.workdir)} && timeout -k 5 {int(wall) + 1} bash -c {quote(line)} "
            f">{out} 2>{out}.err </dev/null"
        )
        started = time.perf_counter()
        timed_out, rc, err_tail = False, None, ""
        try:
            res = await sb.exec(script, timeout=wall + 15, session=f"cli-{self.name}", max_output=4000)
            timed_out, rc = res.timed_out or res.exit_code in (124, 137), res.exit_code
        except SandboxDeadError as exc:
            return self._finish(
                EpisodeResult([], None, ExitReason.SANDBOX_DEAD, None, metrics, error=str(exc))
            )
        except SandboxError as exc:
            err_tail = str(exc)
        metrics["harness_s"] = time.perf_counter() - started
        stdout = await _read(sb, out)
        err_tail = err_tail or "\n".join(
            t for t in ((await _read(sb, f"{out}.err")).strip()[-1500:], stdout.strip()[-1500:]) if t
        )
        stated, answer = self.outcome(stdout, rc)
        metrics.update(harness_exit_code=rc, model_calls=scoped.calls, refused_calls=scoped.refused)
        if timed_out:
            metrics["budget_hit"] = "wall_time"
        reason, error = self._exit_reason(rc, timed_out, stated, session, scoped, err_tail)
        if reason == ExitReason.INTERNAL_ERROR and not await sb.alive():
            reason, error = ExitReason.SANDBOX_DEAD, "the sandbox died while the CLI ran"
        messages = list(session.segments[-1].messages) if session.segments else task.messages()
        result = EpisodeResult(messages, None, reason, None, metrics, error=error)
        result.answer = answer if reason == ExitReason.FINISHED else None
        await attach_segments(session, result)
        return self._finish(result)

    def _finish(self, result: EpisodeResult) -> EpisodeResult:
        result.metrics["harness"] = self.name
        return result

    def _exit_reason(
        self,
        rc: int | None,
        timed_out: bool,
        stated: ExitReason | None,
        session: Session,
        scoped: ScopedApp,
        err_tail: str,
    ) -> tuple[ExitReason, str | None]:
        """The one exit reason, from what the harness saw first-hand before what the CLI says."""
        if timed_out:
            return ExitReason.TIMEOUT_BUDGET, f"{self.name} overran the episode's wall time"
        if scoped.refused:
            return ExitReason.MAX_TURNS, None
        if session.context_full or any(s.ended for s in session.segments):
            return ExitReason.CONTEXT_LIMIT, None
        if stated is not None:
            return stated, None
        if rc == 0:
            return ExitReason.FINISHED, None
        if scoped.server_errors or session.engine_errors:
            return ExitReason.MODEL_ERROR, f"the engine or gateway failed: {err_tail}"
        if session.state != "open":
            return ExitReason.CANCELLED, f"the session was {session.state}"
        return ExitReason.INTERNAL_ERROR, f"{self.name} exited {rc}: {err_tail}"


async def _read(sb: Any, path: str) -> str:
    with contextlib.suppress(SandboxError, OSError):
        return (await sb.read_file(path)).decode("utf-8", errors="replace")
    return ""


async def cli_doctor(name: str, binary: str) -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor` row of one harness CLI: installed (make clis) and runnable."""
    row = f"harness {name}"
    root = cli_dir()
    if root is None:
        return [(row, None, "not installed: make clis (needs node and npm)")]
    exe = root / "node_modules" / ".bin" / binary
    try:
        proc = await asyncio.create_subprocess_exec(
            str(exe), "--version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    except (OSError, TimeoutError) as exc:
        return [(row, False, f"{exe}: {exc}")]
    text = out.decode(errors="replace").strip().splitlines()
    return [(row, proc.returncode == 0, f"{text[-1] if text else ''} ({exe})")]


class CliConfig(BaseModel):
    """How a CLI is run, beyond what the run's agent config says (turns, wall time): a preset of
    its own flags (`trimmed` fits an 8K model; `full` is the CLI's defaults), extra flags, env."""

    model_config = ConfigDict(extra="forbid")

    preset: str = "trimmed"
    args: list[str] = Field(default_factory=list, description="extra flags after the preset's")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for the CLI")


def cli_config(agent: str, arg: str | None, presets: dict[str, list[str]]) -> tuple[CliConfig, list[str]]:
    """`AGENT[:PRESET|:FILE.yaml]` -> (config, the preset's flags); a mistake names the fix."""
    if arg and (arg.endswith((".yaml", ".yml")) or "/" in arg):
        path = Path(arg)
        if not path.is_file():
            raise ConfigError(f"agent kind {agent}:{arg}: no such config file")
        try:
            config = CliConfig.model_validate(yaml.safe_load(path.read_text()) or {})
        except ValidationError as exc:
            raise ConfigError(f"agent kind {agent}:{arg}: {first_error(exc, where='config')}") from None
    else:
        config = CliConfig(preset=arg or "trimmed")
    if config.preset not in presets:
        raise ConfigError(f"agent kind {agent}: preset {config.preset!r}; known: {', '.join(presets)}")
    return config, [*presets[config.preset], *config.args]


def exports(env: dict[str, str]) -> str:
    return "export " + " ".join(f"{k}={quote(v)}" for k, v in env.items())
