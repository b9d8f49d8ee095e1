"""The Tool contract: a name, a description, an argument model, and `run` inside a sandbox.

A bad call by the model is not an exception: `call` turns it into a `ToolResult` with
status "error" whose text says which argument is wrong and what the schema expects, so the
model can fix the call on its next turn. Exceptions are kept for what the model cannot fix:
a misconfigured tool (`ToolError`) or a dead sandbox (`SandboxError`).
"""

from __future__ import annotations

import copy
import json
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from uniagent.errors import ToolError
from uniagent.sandbox.base import Sandbox

Status = Literal["ok", "error", "timeout"]

DEFAULT_COMMAND_TIMEOUT_S = 60.0
"""Seconds one command of the model may run when no agent says otherwise: the default of
`agent.command_timeout_s`, the one setting for this in every agent."""


@dataclass
class ToolResult:
    """What a tool call produced. `text` is the observation the model sees next."""

    text: str
    status: Status = "ok"
    done: bool = False
    """Set by tools that end the episode (submit, finish)."""
    answer: str | None = None
    patch: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class NoArgs(BaseModel):
    """For tools that take no arguments; still rejects any the model invents."""

    model_config = ConfigDict(extra="forbid")


class NoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


def clean_schema(schema: Any) -> Any:
    """Pydantic's JSON schema, minus what only adds tokens or confuses small models.

    Titles repeat the field names; `anyOf [X, null]` for an optional field with a `None`
    default says nothing a model needs (leaving it out is the way to pass "nothing").
    """
    if isinstance(schema, list):
        return [clean_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: clean_schema(v) for k, v in schema.items() if k != "title"}
    variants = out.get("anyOf")
    if isinstance(variants, list) and out.get("default", ...) is None:
        rest = [v for v in variants if not (isinstance(v, dict) and v.get("type") == "null")]
        if len(rest) == 1 and isinstance(rest[0], dict):
            out.pop("anyOf")
            out.pop("default")
            out = {**rest[0], **out}
    if "properties" in out and isinstance(out["properties"], dict):
        out["properties"] = {k: clean_schema(v) for k, v in out["properties"].items()}
    return out


def _type_label(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    kind = schema.get("type")
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_type_label(schema['items'])}"
    if isinstance(kind, str):
        return kind
    variants = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(variants, list):
        return " or ".join(_type_label(v) for v in variants if isinstance(v, dict))
    return "any"


_installed: weakref.WeakKeyDictionary[Sandbox, set[str]] = weakref.WeakKeyDictionary()
"""Per sandbox, the script files already written into its tools_dir (so each goes in once)."""
_schemas: weakref.WeakKeyDictionary[type[BaseModel], dict[str, Any]] = weakref.WeakKeyDictionary()
"""Per `Args` model, its cleaned JSON schema (`Tool.parameters`)."""


class Tool(ABC):
    """Subclasses set `name`, `description`, `Args` (and `Config` if configurable) and `run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]] = NoArgs
    Config: ClassVar[type[BaseModel]] = NoConfig
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    """How long one command of this tool may run: the agent's `command_timeout_s`, set with
    `with_command_timeout` by the agent that runs the tool (tools that run commands read it)."""

    def __init__(self, **config: Any) -> None:
        try:
            self.config = self.Config.model_validate(config)
        except ValidationError as exc:
            allowed = ", ".join(self.Config.model_fields) or "none"
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(config)'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolError(
                f"tool {self.name!r} config: {problems} (allowed config keys: {allowed})"
            ) from None

    def with_command_timeout(self, seconds: float) -> Self:
        """This tool with the agent's per-command timeout (a copy: an instance may be shared)."""
        tool = copy.copy(self)
        tool.command_timeout_s = seconds
        return tool

    # -- schema --------------------------------------------------------------------------
    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """JSON schema of the arguments, generated from `Args` once per class (pydantic builds it
        anew on every call: ~2 ms of CPU for an episode's three tools); a copy each call, callers
        may change it."""
        schema = _schemas.get(cls.Args)
        if schema is None:
            schema = clean_schema(cls.Args.model_json_schema())
            schema.setdefault("properties", {})
            schema.pop("description", None)  # the model's docstring is for developers
            _schemas[cls.Args] = schema
        return copy.deepcopy(schema)

    def spec(self) -> dict[str, Any]:
        """OpenAI-style tool schema, as chat templates and `parsers.normalize_tools` take it."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.describe(), "parameters": self.parameters()},
        }

    def describe(self) -> str:
        """The description the model reads; tools whose limits are configurable mention them here."""
        return self.description

    # -- calling -------------------------------------------------------------------------
    async def call(self, raw_args: dict[str, Any] | str | None, sandbox: Sandbox) -> ToolResult:
        """Validate the model's arguments (a dict or a JSON string), then `run`."""
        args = self.validate(raw_args)
        if isinstance(args, ToolResult):
            return args
        return await self.run(args, sandbox)

    def validate(self, raw_args: dict[str, Any] | str | None) -> BaseModel | ToolResult:
        """The parsed arguments, or an error observation that tells the model how to fix them."""
        data: Any = raw_args
        if raw_args is None or (isinstance(raw_args, str) and not raw_args.strip()):
            data = {}
        elif isinstance(raw_args, str):
            try:
                data = json.loads(raw_args)
            except json.JSONDecodeError as exc:
                return self._arg_error([f"the arguments are not valid JSON ({exc.msg} at char {exc.pos})"])
        if not isinstance(data, dict):
            return self._arg_error([f"the arguments must be a JSON object, got {type(data).__name__}"])
        try:
            return self.Args.model_validate(data)
        except ValidationError as exc:
            return self._arg_error([self._describe(e) for e in exc.errors()])

    def _describe(self, err: Any) -> str:
        props = self.parameters()["properties"]
        loc = ".".join(str(p) for p in err["loc"])
        top = str(err["loc"][0]) if err["loc"] else ""
        expected = f" (expected {_type_label(props[top])})" if top in props else ""
        if err["type"] == "missing":
            return f"`{loc}` is required but missing{expected}"
        if err["type"] == "extra_forbidden":
            return f"`{loc}` is not a parameter of `{self.name}`; allowed: {', '.join(props) or 'none'}"
        if not err["loc"]:
            return err["msg"]
        got = json.dumps(err.get("input"), ensure_ascii=False, default=str)
        if len(got) > 80:
            got = got[:77] + "..."
        return f"`{loc}`: {err['msg']}{expected}; got {got}"

    def _arg_error(self, problems: list[str]) -> ToolResult:
        schema = self.parameters()
        required = schema.get("required", [])
        lines = [f"Invalid arguments for `{self.name}`:"]
        lines += [f"- {p}" for p in problems]
        lines.append("Parameters:")
        for pname, pschema in schema["properties"].items():
            req = "required" if pname in required else "optional"
            lines.append(f"- {pname} ({_type_label(pschema)}, {req})")
        if not schema["properties"]:
            lines.append("- none: call it with an empty object {}")
        lines.append(f"Call `{self.name}` again with corrected arguments.")
        return ToolResult("\n".join(lines), status="error", metadata={"invalid_arguments": problems})

    @abstractmethod
    async def run(self, args: Any, sandbox: Sandbox) -> ToolResult:
        """Do the work. `args` is an instance of `Args`, already validated."""

    # -- tool-as-bash --------------------------------------------------------------------
    def script(self) -> tuple[str, bytes] | None:
        """(filename, content) of a command that does this tool's work from a shell, if any.

        Black-box harnesses only have a shell; they call the same implementation this way.
        """
        return None

    async def ensure_script(self, sandbox: Sandbox, *, force: bool = False) -> str:
        """Write this tool's script into the sandbox's tools_dir (once, unless `force`); returns its path."""
        script = self.script()
        if script is None:
            raise ToolError(f"tool {self.name!r} has no script to install")
        filename, data = script
        path = f"{sandbox.tools_dir.rstrip('/')}/{filename}"
        done = _installed.setdefault(sandbox, set())
        if force or filename not in done:
            await sandbox.write_file(path, data, mode=0o755)
            done.add(filename)
        return path
