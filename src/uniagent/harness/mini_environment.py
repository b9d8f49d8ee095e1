"""mini-swe-agent's `Environment` over a uniagent `Sandbox`: each command the harness runs goes to
the episode's sandbox, the way mini's docker environment runs each in `docker exec` (a fresh
subshell in the workdir). mini itself runs unmodified in a thread (mini_swe_agent.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from uniagent.errors import SandboxDeadError, SandboxError
from uniagent.sandbox.base import Sandbox

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SandboxEnvironmentConfig(BaseModel):
    cwd: str = ""
    env: dict[str, str] = {}
    timeout: float = 60.0


class SandboxEnvironment:
    """mini-swe-agent's `Environment` protocol over a uniagent `Sandbox`.

    Called from the harness thread; each command is a coroutine on the episode's event loop.
    Every command runs in a subshell of the sandbox's shell (cwd and env not persistent), as in
    mini's own environments. `timeout_budget` commands may time out before the episode ends.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        loop: asyncio.AbstractEventLoop,
        *,
        template_vars: dict[str, Any] | None = None,
        timeout_budget: int = 0,
        **kwargs: Any,
    ) -> None:
        self.config = SandboxEnvironmentConfig(**kwargs)
        self.sandbox = sandbox
        self.loop = loop
        self.template_vars = dict(template_vars or {})
        self.timeout_budget = timeout_budget
        self.commands = 0
        self.timeouts = 0
        self.errors = 0

    def execute(self, action: dict, cwd: str = "", *, timeout: float | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import LimitsExceeded

        command = action.get("command", "")
        limit = timeout or self.config.timeout
        self.commands += 1
        future = asyncio.run_coroutine_threadsafe(
            self.sandbox.exec(
                command, timeout=limit, cwd=cwd or self.config.cwd or None, env=self.config.env or None
            ),
            self.loop,
        )
        try:
            res = future.result()
        except SandboxDeadError:
            raise
        except SandboxError as exc:
            self.errors += 1
            alive = asyncio.run_coroutine_threadsafe(self.sandbox.alive(), self.loop).result()
            if not alive:
                raise SandboxDeadError(str(exc)) from exc
            return {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {exc}",
                "extra": {"exception_type": type(exc).__name__, "exception": str(exc)},
            }
        if res.timed_out:
            self.timeouts += 1
            output = {
                "output": res.output,
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: Command '{command}' "
                f"timed out after {limit} seconds",
                "extra": {"exception_type": "TimeoutExpired"},
            }
            if self.timeout_budget and self.timeouts >= self.timeout_budget:
                raise LimitsExceeded(
                    {
                        "role": "exit",
                        "content": "TimeoutBudget",
                        "extra": {"exit_status": "TimeoutBudget", "submission": ""},
                    }
                )
            return output
        output = {"output": res.output, "returncode": res.exit_code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Exactly mini-swe-agent's rule: first output line is the marker and the command succeeded."""
        from minisweagent.exceptions import Submitted

        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config.model_dump(), **self.template_vars, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                }
            }
        }
