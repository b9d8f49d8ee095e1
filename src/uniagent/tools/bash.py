"""`bash`: one command line in the sandbox's persistent shell (cwd and variables carry over)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from uniagent.sandbox.base import Sandbox
from uniagent.tools.base import Status, Tool, ToolResult


class BashArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(
        description="A bash command line (pipes, redirects, `;` and `&&` work). The shell persists "
        "between calls: `cd` and `export` carry over."
    )
    timeout: float | None = Field(
        None, gt=0, description="Seconds before the command is interrupted (optional)."
    )


class BashConfig(BaseModel):
    """The timeout of a call without `timeout` is the agent's `command_timeout_s`, not a tool key."""

    model_config = ConfigDict(extra="forbid")

    max_timeout_s: float = Field(
        600.0, gt=0, description="the largest timeout the model may ask for (never below the agent's)"
    )
    session: str = Field("default", description="the sandbox shell session commands run in")


class BashTool(Tool):
    name = "bash"
    description = (
        "Run a bash command in the sandbox and see its output (stdout and stderr together). "
        "Interactive programs cannot get input; start long-running servers in the background."
    )
    Args = BashArgs
    Config = BashConfig
    config: BashConfig

    @property
    def max_timeout_s(self) -> float:
        return max(self.config.max_timeout_s, self.command_timeout_s)

    def describe(self) -> str:
        return (
            f"{self.description} Timeout: default {self.command_timeout_s:g}s, "
            f"at most {self.max_timeout_s:g}s per call."
        )

    async def run(self, args: BashArgs, sandbox: Sandbox) -> ToolResult:
        if not args.command.strip():
            return ToolResult(
                "The command is empty. Pass a bash command line in `command`, e.g. `ls -la`.", status="error"
            )
        notes: list[str] = []
        timeout = args.timeout if args.timeout is not None else self.command_timeout_s
        if timeout > self.max_timeout_s:
            cap = self.max_timeout_s
            notes.append(f"[timeout {timeout:g}s is above the maximum; the command ran with {cap:g}s]")
            timeout = cap
        res = await sandbox.exec(args.command, timeout=timeout, session=self.config.session)
        text = res.output.strip("\n")
        status: Status = "ok"
        if res.timed_out:
            status = "timeout"
            # The sandbox has already said that it timed out; say what to do about it.
            notes.append(
                f"[If it needs longer, pass a larger `timeout` (at most {self.max_timeout_s:g}s) or "
                "run it in the background, e.g. `cmd > out.log 2>&1 &`, and check the log later.]"
            )
        elif res.exit_code not in (0, None):
            notes.append(f"[exit code {res.exit_code}]")
        if not text.strip():
            text = "[the command produced no output]"
        if notes:
            text += "\n" + "\n".join(notes)
        return ToolResult(
            text,
            status=status,
            metadata={
                "exit_code": res.exit_code,
                "timed_out": res.timed_out,
                "clipped": res.clipped,
                "duration_s": round(res.duration_s, 3),
            },
        )
