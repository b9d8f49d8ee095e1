"""Models: token-level engines (`TokenEngine`) and message-level chat models (`ChatModel`).

`LocalEngine` (torch) and `OpenAIChatModel` (openai SDK) are imported on first use, so that
`import uniagent.models` stays cheap for code that only needs the contracts or a replay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from uniagent.models.base import (
    AssistantTurn,
    ChatModel,
    Generation,
    SamplingParams,
    SessionSpec,
    TokenEngine,
)
from uniagent.models.replay import RecordingEngine, ReplayEngine, ReplayRecord
from uniagent.models.token_chat import TokenChatModel

if TYPE_CHECKING:
    from uniagent.models.local import LocalEngine
    from uniagent.models.openai_chat import OpenAIChatModel

_LAZY = {
    "LocalEngine": "uniagent.models.local",
    "OpenAIChatModel": "uniagent.models.openai_chat",
}

__all__ = [
    "AssistantTurn",
    "ChatModel",
    "Generation",
    "LocalEngine",
    "OpenAIChatModel",
    "RecordingEngine",
    "ReplayEngine",
    "ReplayRecord",
    "SamplingParams",
    "SessionSpec",
    "TokenChatModel",
    "TokenEngine",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'uniagent.models' has no attribute {name!r}")
