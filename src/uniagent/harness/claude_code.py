"""The `claude-code[:PRESET|:FILE.yaml]` agent: the real Claude Code CLI (`claude -p`) in the
episode's sandbox, talking Anthropic Messages to its gateway session over the session's unix
socket (`ANTHROPIC_UNIX_SOCKET`; no forwarder, no network). Shared machinery: cli_agent.py.

Presets: `trimmed` (default) offers only the Bash tool (`--tools Bash`), keeping Claude Code's
own system prompt: ~2.3K tokens, so an 8K model has room for turns; `bare` adds `--bare` (~0.6K);
`full` is the CLI's default tool set (~21K tokens: a small model's context error, which Claude
Code reports as `prompt_too_long`, rc 1).

Side traffic is off by its documented switch (`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`:
telemetry, error reports, the auto-updater, the title call), retries are 0, and the billing
header and prompt caching marks are dropped so histories compare cleanly. Inside the sandbox the
process is uid 0, so `IS_SANDBOX=1` is what allows `--dangerously-skip-permissions`.
`agent.command_timeout_s` is its Bash tool's default timeout (`BASH_DEFAULT_TIMEOUT_MS`).
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

PRESETS: dict[str, list[str]] = {
    "trimmed": ["--tools", "Bash"],
    "bare": ["--bare", "--tools", "Bash"],
    "full": [],
}


class ClaudeCodeAgent(CliAgent):
    name = "claude-code"
    protocol = "anthropic"

    presets = PRESETS

    def binary(self) -> str:
        """The native ELF (postinstall links it over bin/claude.exe; the platform package is
        the same file and needs no install script)."""
        assert self.install is not None
        native = self.install / "node_modules/@anthropic-ai/claude-code-linux-x64/claude"
        return str(native if native.exists() else self.install / "node_modules/.bin/claude")

    def files(self, session_dir: Path, base_url: str, episode: Episode) -> dict[str, str]:
        return {"task.txt": task_text(episode.task)}

    def command(self, session_dir: Path, session: Session, token: str, episode: Episode) -> str:
        assert self.gateway is not None
        env = {
            "HOME": "/tmp",
            "CLAUDE_CONFIG_DIR": "/tmp/.claude-uniagent",
            "IS_SANDBOX": "1",
            "ANTHROPIC_UNIX_SOCKET": str(session_dir / SOCKET),
            "ANTHROPIC_BASE_URL": f"http://gateway/sessions/{session.id}",
            "ANTHROPIC_API_KEY": token,
            "ANTHROPIC_MODEL": self.gateway.model_name,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
            "DISABLE_PROMPT_CACHING": "1",
            "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
            "CLAUDE_CODE_DISABLE_THINKING": "1",
            # The agent's per-command timeout is the Bash tool's default; as with our bash tool,
            # a call may ask for more, up to Claude Code's max (max(10 min, the default)).
            "BASH_DEFAULT_TIMEOUT_MS": str(max(1, round(episode.config.command_timeout_s * 1000))),
            **self.cli.env,
        }
        turns = ["--max-turns", str(episode.config.max_turns)] if episode.config.max_turns else []
        argv = [
            "--output-format", "json", "--dangerously-skip-permissions", "--no-session-persistence",
            *turns, *self.flags,
        ]  # fmt: skip
        task = quote(str(session_dir / "task.txt"))
        # The prompt right after -p: --tools takes a variable number of values.
        return f'{exports(env)}\nexec {quote(self.binary())} -p "$(cat {task})" {" ".join(map(quote, argv))}'

    def outcome(self, stdout: str, rc: int | None) -> tuple[ExitReason | None, str | None]:
        """`--output-format json` prints one result object: `subtype` says how it ended."""
        try:
            result = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
        except ValueError:
            return None, None
        if not isinstance(result, dict):
            return None, None
        answer = result.get("result") if isinstance(result.get("result"), str) else None
        if result.get("subtype") == "error_max_turns":
            return ExitReason.MAX_TURNS, answer
        return None, answer


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    return await cli_doctor(ClaudeCodeAgent.name, "claude")
