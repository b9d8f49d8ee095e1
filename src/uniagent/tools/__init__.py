"""Tool definitions: an argument schema (from a pydantic model) and how each runs in a sandbox.

`build_tools(["bash", "str_replace_editor", {"name": "submit", "base_ref": "HEAD"}])` gives
instances; `tool.spec()` is the OpenAI-style schema for the model; `await tool.call(args,
sandbox)` validates the model's arguments and runs the tool, returning a `ToolResult`.
"""

from uniagent.tools.base import Tool, ToolResult
from uniagent.tools.bash import BashTool
from uniagent.tools.editor import EditorTool
from uniagent.tools.registry import (
    available_tools,
    build_tools,
    get_tool,
    install_tool_scripts,
    register_tool,
)
from uniagent.tools.search import SearchTool
from uniagent.tools.submit import FinishTool, SubmitTool

__all__ = [
    "BashTool",
    "EditorTool",
    "FinishTool",
    "SearchTool",
    "SubmitTool",
    "Tool",
    "ToolResult",
    "available_tools",
    "build_tools",
    "get_tool",
    "install_tool_scripts",
    "register_tool",
]
