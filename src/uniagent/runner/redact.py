"""The run's redactor: the environment's secrets plus the sandbox settings that name a token or
key, with the run's tokenizer (loaded on first need) to redact trajectories at the token level.

The redactor itself lives in `uniagent.redact` (the gateway, below the runner, uses it too).
"""

from __future__ import annotations

from typing import Any

from uniagent.redact import MASK, Redactor, redact_logs, setting_secrets
from uniagent.runner.config import RunConfig

__all__ = ["MASK", "Redactor", "run_redactor"]


def run_redactor(config: RunConfig) -> Redactor:
    """Also redacts this process's log records from now on."""
    from uniagent.models.registry import tokenizer_spec

    secrets = setting_secrets(config.sandbox)
    spec = tokenizer_spec(config.model)

    def load() -> Any:
        from uniagent.models.loading import load_tokenizer, resolve_model

        return load_tokenizer(resolve_model(spec))

    redactor = Redactor(extra=secrets, tokenizer=load)
    redact_logs(redactor)
    return redactor
