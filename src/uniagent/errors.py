"""Errors a user can act on.

Every user mistake raises a `UniAgentError` subclass whose message says what to fix; the
CLI prints it without a traceback and exits 2.
"""

from __future__ import annotations


class UniAgentError(Exception):
    """Base for errors whose message tells the user what to fix."""


class TemplateError(UniAgentError):
    """A chat template cannot render a message shape uniagent needs."""


class ModelNotFoundError(UniAgentError):
    """A model path or packaged model could not be found."""


class EngineError(UniAgentError):
    """A token engine or endpoint failed in a way the caller should see."""


class TrajectoryError(UniAgentError):
    """A trajectory violates its invariants (lengths, masks, spans)."""


class ConfigError(UniAgentError):
    """A config key or value is wrong; the message names it."""


class SandboxError(UniAgentError):
    """A sandbox operation failed (the message says which and why)."""


class SandboxStartError(SandboxError):
    """A sandbox could not be started, even after retries."""


class SandboxDeadError(SandboxError):
    """The sandbox (or its shell) died; the episode cannot go on in it."""


class ToolError(UniAgentError):
    """A tool is misconfigured (not a bad call by the model: that becomes an observation)."""


class TrainingError(UniAgentError):
    """A training step cannot go on honestly (e.g. most of its episodes failed for infrastructure reasons)."""


class PreflightError(UniAgentError):
    """The model or the sandbox backend failed its check before a run's first episode."""


class RunStoppedError(UniAgentError):
    """A run stopped early: its first episodes all failed the same infrastructure way."""


class RunInterruptedError(UniAgentError):
    """A run or training stopped by SIGTERM/SIGINT after a clean stop (runner/interrupt.py);
    the message says how to resume, `exit_status` is 128 + the signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_status = 128 + signum
