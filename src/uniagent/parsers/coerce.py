"""Schema-aware argument coercion and checking, shared by every format.

Formats like Qwen3-Coder's XML carry every value as text, and JSON formats still see models
quote numbers; the tool's JSON schema is the only thing that says what was meant. A string is
converted only when the schema does not accept strings, so text the tool wants is never altered.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from uniagent.parsers.base import (
    CallRenderer,
    Specs,
    ToolCall,
    ToolFormatError,
    ToolSpec,
    format_error,
    normalize_tools,
)
from uniagent.parsers.text import NO_TOOLS, tools_header

# Tried in this order when a schema allows several non-string types: the strictest readings first,
# so "1" becomes 1 rather than 1.0 and "null" becomes None rather than failing as a number.
_TYPE_ORDER = ("null", "boolean", "integer", "number", "object", "array")
_INT_RE = re.compile(r"[+-]?\d+(?:\.0*)?")
_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
# Python-literal fallback is for short model-written values; cap it so hostile text stays cheap.
_LITERAL_EVAL_LIMIT = 20_000
_PY_TYPES: dict[type, str] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
    list: "array",
    dict: "object",
}


def schema_types(schema: Any) -> set[str]:
    """JSON types a schema admits, looking through `type` lists, `anyOf`/`oneOf`/`allOf` and `enum`."""
    if not isinstance(schema, dict):
        return set()
    types: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        types.add(kind)
    elif isinstance(kind, list):
        types.update(k for k in kind if isinstance(k, str))
    for key in ("anyOf", "oneOf", "allOf"):
        subs = schema.get(key)
        if isinstance(subs, list):
            for sub in subs:
                types |= schema_types(sub)
    if not types and isinstance(schema.get("enum"), list):
        types.update(_PY_TYPES.get(type(v), "string") for v in schema["enum"])
    if not types and "properties" in schema:
        types.add("object")
    if not types and "items" in schema:
        types.add("array")
    return types


def _json_container(text: str, kind: type) -> tuple[bool, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, kind):
        return True, value
    if len(text) > _LITERAL_EVAL_LIMIT:
        return False, None
    # Models often write Python literals (single quotes, True/None); accept them only when the
    # result survives a JSON round trip, so downstream `json.dumps` of the call cannot fail.
    try:
        value = json.loads(json.dumps(ast.literal_eval(text.strip())))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    return (True, value) if isinstance(value, kind) else (False, None)


def _from_text(text: str, kind: str) -> tuple[bool, Any]:
    """Read `text` as JSON type `kind`; (False, None) when it does not look like one."""
    bare = text.strip()
    try:
        if kind == "null" and bare.lower() in ("null", "none"):
            return True, None
        if kind == "boolean" and bare.lower() in ("true", "false"):
            return True, bare.lower() == "true"
        if kind == "integer" and _INT_RE.fullmatch(bare):
            return True, int(bare.split(".")[0])
        if kind == "number" and _NUMBER_RE.fullmatch(bare):
            return True, (float(bare) if any(c in bare for c in ".eE") else int(bare))
    except ValueError:  # int() refuses absurdly long digit strings
        return False, None
    if kind == "object":
        return _json_container(bare, dict)
    if kind == "array":
        return _json_container(bare, list)
    return False, None


def coerce_value(value: Any, schema: Any) -> Any:
    """Turn `value` into what `schema` says, recursing into arrays and objects; unknowns pass through."""
    types = schema_types(schema)
    if isinstance(value, str):
        if not types or "string" in types:
            return value
        for kind in _TYPE_ORDER:
            if kind in types:
                ok, converted = _from_text(value, kind)
                if ok:
                    value = converted
                    break
        else:
            return value
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [coerce_value(v, schema["items"]) for v in value]
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        props = schema["properties"]
        return {k: coerce_value(v, props[k]) if k in props else v for k, v in value.items()}
    return value


def coerce_arguments(arguments: dict[str, Any], spec: ToolSpec) -> dict[str, Any]:
    """Coerce each argument by its parameter schema; parameters the schema lacks are kept as they are."""
    props = spec.properties
    return {k: coerce_value(v, props[k]) if k in props else v for k, v in arguments.items()}


def argument_problems(arguments: dict[str, Any], spec: ToolSpec) -> list[str]:
    """Unknown and missing-required parameter names, phrased for the model; empty when fine."""
    problems = []
    if not spec.accepts_extra:
        unknown = [k for k in arguments if k not in spec.properties]
        if unknown:
            problems.append("unknown parameter(s) " + ", ".join(repr(k) for k in unknown))
    missing = [r for r in spec.required if r not in arguments]
    if missing:
        problems.append("missing required parameter(s) " + ", ".join(repr(m) for m in missing))
    return problems


def _placeholder(name: str, schema: Any) -> Any:
    if isinstance(schema, dict):
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][0]
        if "default" in schema:
            return schema["default"]
    types = schema_types(schema)
    for kind, value in (
        ("string", f"example {name}"),
        ("integer", 1),
        ("number", 1.5),
        ("boolean", True),
        ("array", []),
        ("object", {}),
        ("null", None),
    ):
        if kind in types:
            return value
    return f"example {name}"


def example_call(spec: ToolSpec | None) -> ToolCall:
    """A call that passes validation: required parameters (or else the first one) with placeholder values."""
    if spec is None:
        return ToolCall("tool_name", {"parameter_name": "value"})
    names = spec.required or list(spec.properties)[:1]
    return ToolCall(spec.name, {n: _placeholder(n, spec.properties.get(n)) for n in names})


def tool_error(problem: str, specs: Specs, render: CallRenderer, tool: str | None = None) -> ToolFormatError:
    """The error for `problem`, with an example for the tool the model meant (or the first tool)."""
    spec = None
    if specs:
        spec = specs.get(tool) if tool in specs else next(iter(specs.values()))
    return format_error(problem, specs, render(example_call(spec)) if specs != {} else None)


def checked_call(
    name: str, arguments: dict[str, Any], specs: Specs, render: CallRenderer, where: str
) -> ToolCall:
    """Validate a parsed call against the tools and coerce its arguments; `where` locates it in the turn."""
    if specs is None:
        return ToolCall(name, arguments)
    spec = specs.get(name)
    if spec is None:
        raise tool_error(f"{where}: unknown tool {name!r}.", specs, render)
    problems = argument_problems(arguments, spec)
    if problems:
        raise tool_error(f"{where} to {name!r}: " + "; ".join(problems) + ".", specs, render, name)
    return ToolCall(name, coerce_arguments(arguments, spec))


def call_format_prompt(
    tools: list[dict[str, Any]], render: CallRenderer, how: str, open_tag: str, rules: tuple[str, ...] = ()
) -> str:
    """Self-contained tool prompt for templates without native tool support: the tool list, `how`
    (the format, ending in a blank line), an example call, then the rules every format shares with
    the format's own `rules` after the first. One text, so the formats' prompts cannot drift."""
    specs = normalize_tools(tools) or {}
    if not specs:
        return NO_TOOLS
    example = render(example_call(next(iter(specs.values()))))
    lines = (
        "Write any reasoning before the first tool call.",
        *rules,
        f"For several calls, write several {open_tag} blocks one after another.",
        "Use only the tools and parameter names listed above, and give every required parameter.",
        "After your tool calls, stop and wait for the results.",
        "If no tool is needed, answer directly without any tool call.",
    )
    return (
        tools_header(specs.values())
        + how
        + f"For example:\n{example}\n\n"
        + "Rules:\n"
        + "\n".join(f"- {line}" for line in lines)
    )
