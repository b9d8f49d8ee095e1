"""Tools by name: the built-ins, plus whatever `register_tool` adds.

Task configs name their tools as strings (`"bash"`) or as dicts with config
(`{"name": "search", "corpus": "wiki.jsonl"}`); `build_tools` turns such a list into
instances and says precisely what is wrong with a bad entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from uniagent.errors import ToolError
from uniagent.sandbox.base import Sandbox
from uniagent.tools.base import Tool
from uniagent.tools.bash import BashTool
from uniagent.tools.editor import EditorTool
from uniagent.tools.search import SearchTool
from uniagent.tools.submit import FinishTool, SubmitTool

_TOOLS: dict[str, type[Tool]] = {}


def register_tool(cls: type[Tool], *, replace: bool = False) -> type[Tool]:
    """Make `cls` buildable by its `name` (usable as a class decorator)."""
    if not replace and cls.name in _TOOLS and _TOOLS[cls.name] is not cls:
        raise ToolError(f"a tool named {cls.name!r} is already registered ({_TOOLS[cls.name].__name__})")
    _TOOLS[cls.name] = cls
    return cls


for _cls in (BashTool, EditorTool, SubmitTool, FinishTool, SearchTool):
    register_tool(_cls)


def available_tools() -> list[str]:
    return sorted(_TOOLS)


def get_tool(name: str, **config: Any) -> Tool:
    """An instance of the tool registered as `name`, configured with `config`."""
    cls = _TOOLS.get(name)
    if cls is None:
        raise ToolError(f"unknown tool {name!r}; available tools: {', '.join(available_tools())}")
    return cls(**config)


def build_tools(specs: Iterable[str | dict[str, Any] | Tool]) -> list[Tool]:
    """Tool instances from names, `{"name": ..., **config}` dicts or ready instances, in order."""
    tools: list[Tool] = []
    for i, spec in enumerate(specs):
        if isinstance(spec, Tool):
            tool = spec
        elif isinstance(spec, str):
            tool = get_tool(spec)
        elif isinstance(spec, dict):
            config = dict(spec)
            name = config.pop("name", None)
            if not isinstance(name, str):
                raise ToolError(
                    f"tools[{i}]: a tool given as a mapping needs a `name` string, e.g. "
                    f'{{"name": "search", "corpus": "docs.jsonl"}}; got {spec!r}'
                )
            tool = get_tool(name, **config)
        else:
            raise ToolError(
                f"tools[{i}]: expected a tool name or a mapping with `name`, got {type(spec).__name__}"
            )
        if any(t.name == tool.name for t in tools):
            raise ToolError(f"tools[{i}]: tool {tool.name!r} is listed twice; tool names must be unique")
        tools.append(tool)
    return tools


async def install_tool_scripts(sandbox: Sandbox, tools: Iterable[Tool]) -> list[str]:
    """Put every tool's script (tool-as-bash) into `sandbox.tools_dir`, which is on PATH in its shells.

    Returns the paths written. For black-box harnesses, which call tools as shell commands.
    """
    return [await tool.ensure_script(sandbox, force=True) for tool in tools if tool.script() is not None]
