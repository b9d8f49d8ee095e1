"""Many episodes at once: concurrency, the run store, resume, the Ray backend."""

from uniagent.runner.config import RunConfig, build_config
from uniagent.runner.run import Progress, Runner, run
from uniagent.runner.store import RunStore
from uniagent.runner.summary import pass_at_k, summarize

__all__ = ["Progress", "RunConfig", "RunStore", "Runner", "build_config", "pass_at_k", "run", "summarize"]
