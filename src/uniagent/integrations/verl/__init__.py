"""uniagent inside verl: `UniAgentLoop` (an `AgentLoopBase`), `VerlEngine`, data prep and launch recipes.

Nothing here imports verl at package import time: `uniagent` registers this package's CLI commands on
every start, and verl (with torch, ray, vllm) is only needed when a verl command or the agent loop runs.
Import `uniagent.integrations.verl.loop` for the agent loop itself.
"""

from uniagent.integrations.verl.engine import VerlEngine

__all__ = ["VerlEngine"]
