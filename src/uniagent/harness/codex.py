"""The `codex[:PRESET|:FILE.yaml]` agent: the real Codex CLI (`codex exec`) in the episode's
sandbox, talking OpenAI Responses to its gateway session. Shared machinery: cli_agent.py.

Codex has no unix-socket provider, so `forward.py` (stdlib) relays a loopback port of the
sandbox's own network namespace (`FORWARD_PORT`, the same in every sandbox; any free port when
the sandbox shares the host's network) to the session's socket; nothing else is reachable.
Codex has no max-turns flag either: the session socket answers past the budget with
`context_length_exceeded`, which Codex does not retry (exit reason: max_turns).

Its config (`config.toml` in a private CODEX_HOME) turns off what would reach the network or hang
offline, by the documented settings: plugins (the curated-plugins sync), analytics (OTLP
metrics), web search, `unbounded_connection_retries` (otherwise it waits for the network
forever), request and stream retries. Its own sandbox is bypassed: it cannot create a user
namespace inside ours, and ours is the isolation.

`agent.command_timeout_s` does not reach Codex: it has no per-command timeout setting. Its
`exec_command` waits `yield_time_ms` (the model's choice, capped) and then leaves the command
running in the background for `write_stdin` to poll; `background_terminal_max_timeout` bounds one
such poll, not the command. Only `agent.wall_time_s` bounds what Codex runs.

Presets: `trimmed` (default) keeps Codex's base prompt but only its two floor tools
(`exec_command`, `write_stdin`) and no skills/permission/app instructions: ~4.7K tokens, fits an
8K model; `minimal` also replaces the base prompt with a few lines (~0.7K); `full` is the CLI's
defaults (~9K tokens: over 8K, the context error Codex understands).
"""

from __future__ import annotations

import json
from pathlib import Path

from uniagent.agent.base import Episode
from uniagent.agent.result import ExitReason
from uniagent.gateway.sessions import Session
from uniagent.harness.cli_agent import SOCKET, CliAgent, cli_doctor, exports
from uniagent.harness.session import task_text
from uniagent.sandbox.procs import quote

FORWARD_PORT = 18016
TRIM = [
    "--disable", "goals", "--disable", "apps", "--disable", "view_image", "--disable", "multi_agent",
    "-c", "tools.experimental_request_user_input.enabled=false",
    "-c", "skills.include_instructions=false", "-c", "skills.bundled.enabled=false",
    "-c", "include_permissions_instructions=false", "-c", "include_apps_instructions=false",
]  # fmt: skip
PRESETS: dict[str, list[str]] = {
    "trimmed": TRIM,
    "minimal": [
        *TRIM,
        "-c",
        "include_environment_context=false",
        "-c",
        "model_instructions_file={dir}/instructions.md",
    ],
    "full": [],
}
MINIMAL_INSTRUCTIONS = (
    "You are a coding agent. Use exec_command to run shell commands in the workspace. "
    "When the task is done, answer with a short summary.\n"
)
CONFIG = """\
model = "{model}"
model_provider = "gw"
approval_policy = "never"
sandbox_mode = "danger-full-access"
web_search = "disabled"
check_for_update_on_startup = false

[model_providers.gw]
name = "uniagent gateway"
base_url = "http://127.0.0.1:{port}/sessions/{session}/v1"
env_key = "GW_TOKEN"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false
unbounded_connection_retries = false

[analytics]
enabled = false
"""


class CodexAgent(CliAgent):
    name = "codex"
    protocol = "responses"

    presets = PRESETS

    def files(self, session_dir: Path, base_url: str, episode: Episode) -> dict[str, str]:
        assert self.gateway is not None
        session = base_url.rsplit("/", 1)[-1]
        config = CONFIG.format(model=self.gateway.model_name, port="PORT", session=session)
        return {
            "task.txt": task_text(episode.task),
            "config.toml": config,
            "instructions.md": MINIMAL_INSTRUCTIONS,
            "forward.py": (Path(__file__).parent / "forward.py").read_text(),
        }

    def command(self, session_dir: Path, session: Session, token: str, episode: Episode) -> str:
        assert self.install is not None
        env = {"HOME": "/tmp", "CODEX_HOME": "/tmp/.codex-uniagent", "GW_TOKEN": token, **self.cli.env}
        port = 0 if getattr(episode.sandbox.config, "network", False) else FORWARD_PORT
        d = str(session_dir)
        flags = [f.replace("{dir}", d) for f in self.flags]
        argv = [
            str(self.install / "node_modules/.bin/codex"), "exec", "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox", "--json", *flags,
        ]  # fmt: skip
        q = quote
        return "\n".join(
            [
                exports(env),
                'mkdir -p "$CODEX_HOME"',
                f"python3 {q(d + '/forward.py')} {port} {q(d + '/' + SOCKET)} /tmp/.uniagent-fwd.port &",
                "fwd=$!",
                "for _ in $(seq 200); do [ -s /tmp/.uniagent-fwd.port ] && break; sleep 0.05; done",
                "port=$(cat /tmp/.uniagent-fwd.port) || { echo 'the forwarder did not start' >&2; exit 70; }",
                f'sed "s/127.0.0.1:PORT/127.0.0.1:$port/" {q(d + "/config.toml")} >"$CODEX_HOME/config.toml"',
                f'{" ".join(map(q, argv))} "$(cat {q(d + "/task.txt")})"',
                "rc=$?",
                'kill "$fwd" 2>/dev/null',
                'exit "$rc"',
            ]
        )

    def outcome(self, stdout: str, rc: int | None) -> tuple[ExitReason | None, str | None]:
        """`--json` prints events; the last `agent_message` item is the answer. A turn that failed
        because the model's reply was cut by its token cap (`max_output_tokens`) ends the run:
        as in the ReAct loop, an unusable reply is the policy's (format_errors)."""
        answer, stated = None, None
        for line in stdout.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            item = event.get("item") if isinstance(event, dict) else None
            if (
                event.get("type") == "item.completed"
                and isinstance(item, dict)
                and item.get("type") == "agent_message"
                and isinstance(item.get("text"), str)
            ):
                answer = item["text"]
            if event.get("type") == "turn.failed" and "max_output_tokens" in json.dumps(event):
                stated = ExitReason.FORMAT_ERRORS
        return stated, answer


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    return await cli_doctor(CodexAgent.name, "codex")
