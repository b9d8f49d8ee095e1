"""Tools by name: the built-ins, plus whatever `register_tool` adds.

`TOOLS` is a `uniagent.registry.Registry` like every extension table: a tool is one module with
its `Tool` subclass plus one line below (the key is the class's `name`).

Task configs name their tools as strings (`"bash"`) or as dicts with config
(`{"name": "search", "corpus": "wiki.jsonl"}`); `build_tools` turns such a list into
instances and says precisely what is wrong with a bad entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from uniagent.errors import ToolError
from uniagent.registry import Entry, Registry
from uniagent.sandbox.base import Sandbox
from uniagent.tools.base import Tool

# One line per tool; the key is the tool class's `name`.
TOOLS = Registry(
    "tool",
    {
        "bash": Entry("uniagent.tools.bash:BashTool", "a persistent bash session"),
        "str_replace_editor": Entry("uniagent.tools.editor:EditorTool", "view, create and edit files"),
        "submit": Entry("uniagent.tools.submit:SubmitTool", "end the episode with the diff"),
        "finish": Entry("uniagent.tools.submit:FinishTool", "end the episode with an answer"),
        "search": Entry("uniagent.tools.search:SearchTool", "search a corpus"),
    },
    error=ToolError,
)


def register_tool(cls: type[Tool], *, replace: bool = False) -> type[Tool]:
    """Make `cls` buildable by its `name` (usable as a class decorator)."""
    if not replace and cls.name in TOOLS:
        existing = TOOLS.load(cls.name)
        if existing is not cls:
            raise ToolError(f"a tool named {cls.name!r} is already registered ({existing.__name__})")
    TOOLS[cls.name] = Entry(cls)
    return cls


def available_tools() -> list[str]:
    return sorted(TOOLS)


def get_tool(name: str, **config: Any) -> Tool:
    """An instance of the tool registered as `name`, configured with `config`."""
    cls: type[Tool] = TOOLS.load(name)
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
