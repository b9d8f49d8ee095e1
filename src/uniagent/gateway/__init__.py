"""OpenAI-compatible HTTP front over any `TokenEngine` that records exact token trajectories,
so black-box harnesses (mini-swe-agent, any OpenAI client) produce training data."""

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
