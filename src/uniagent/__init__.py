"""uniagent: one interaction stack for running and training LLM agents."""

from uniagent.errors import UniAgentError

__version__ = "0.1.0"
__all__ = ["UniAgentError", "__version__"]
