"""HTTP fronts over any `TokenEngine` that record exact token trajectories, so black-box harnesses
produce training data: OpenAI chat (mini-swe-agent, any OpenAI client), Anthropic Messages (Claude
Code) and OpenAI Responses (Codex), one wire module each (`gateway.wire`) over the same sessions."""

from uniagent.gateway.app import Gateway, check_bind, is_loopback
from uniagent.gateway.sessions import GatewayError, Session, SessionConfig, SessionManager

__all__ = [
    "Gateway",
    "GatewayError",
    "Session",
    "SessionConfig",
    "SessionManager",
    "check_bind",
    "is_loopback",
]
