"""Runs that cannot work stop at once, with one error, instead of churning through every task.

Two checks. Before the first episode, `preflight` asks the model for an answer (an endpoint's
health check; a local engine has loaded by then) and starts one sandbox of the run's backend
and runs a command in it: an unreachable endpoint or a broken backend is one clear line, not a
thousand `model_error` episodes. During the run, `InfraGuard` watches the first episodes to
finish: when the first N all end in the same infrastructure failure (the endpoint went down
after the check, the replay file has nothing for these tasks), no further episode starts, the
running ones end and are stored, and the run raises. What is stored stays stored, and
`--resume` later reruns the failed pairs (infrastructure failures are retried on resume).
"""

from __future__ import annotations

from typing import Any

from uniagent.agent.result import ExitReason
from uniagent.errors import PreflightError, UniAgentError
from uniagent.sandbox.config import SandboxConfig

SANDBOX_CHECK_S = 180.0  # a first start may build or pull an image: generous, still bounded


def first_line(text: str, limit: int = 300) -> str:
    return (text.strip().splitlines() or [""])[0][:limit]


async def preflight(factory: Any, sandbox_cfg: SandboxConfig) -> None:
    """Raise `PreflightError` unless the (started) model factory answers and a sandbox runs a command.

    `sandbox_cfg` is the first pending task's sandbox, so a row's image backend is what is checked.
    """
    from uniagent import sandbox as sandboxes
    from uniagent.sandbox.base import probe
    from uniagent.sandbox.config import type_of

    try:
        await factory.check()
    except UniAgentError as exc:
        raise PreflightError(f"preflight: the model does not work: {first_line(str(exc))}") from None
    kind = type_of(sandbox_cfg)
    try:
        sb = sandboxes.create(sandbox_cfg)
    except UniAgentError as exc:
        raise PreflightError(f"preflight: sandbox config: {first_line(str(exc))}") from None
    ok, detail = await probe(sb, SANDBOX_CHECK_S)
    if not ok:
        raise PreflightError(f"preflight: the {kind} sandbox could not run `echo`: {first_line(detail)}")


class InfraGuard:
    """Trips when the first `limit` episodes to finish all end in one infrastructure exit reason.

    Any other outcome first (a policy exit such as `finished`, or a second kind of failure)
    disarms it for the rest of the run: later failures are the run's normal noise, retried on
    resume, and never stop it. `limit` 0 turns it off.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.armed = limit > 0
        self.reason: str | None = None
        self.count = 0

    def observe(self, exit_reason: str, error: str | None) -> str | None:
        """Record one stored episode; return the stop message when the guard trips."""
        if not self.armed:
            return None
        if ExitReason(exit_reason).trainable or self.reason not in (None, exit_reason):
            self.armed = False
            return None
        self.reason = exit_reason
        self.count += 1
        if self.count < self.limit:
            return None
        self.armed = False
        return (
            f"stopped: the first {self.count} episodes all ended {exit_reason} "
            f"(last error: {first_line(error or 'none')})"
        )
