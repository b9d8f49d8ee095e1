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
