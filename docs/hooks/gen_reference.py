"""The manual's two reference pages, generated at build time from the code (an mkdocs hook).

`reference/configuration.md` walks the pydantic settings models (every field's key, type,
default, constraints and description) and `reference/cli.md` walks the Typer app as click sees
it (every command, its help, arguments and options). Neither page is kept in git: a setting or a
flag changes in one place, its source, and the manual follows on the next build.

The hook puts this checkout's `src/` first on `sys.path`, so the pages describe the tree being
built, not whatever uniagent the venv happens to have installed. Only the config modules and
the CLI are imported: no engine, no torch.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

SRC = Path(__file__).resolve().parents[2] / "src"

# The roots a user writes, in the order the page shows them: (anchor, title, "module:Class", how
# it is given).
CONFIG_ROOTS: list[tuple[str, str, str, str]] = [
    (
        "run",
        "Run config",
        "uniagent.runner.config:RunConfig",
        "`uniagent run --config FILE.yaml`, flags and `--set KEY=VALUE` (also what `uniagent verify` reads "
        "its `sandbox` and `agent` from)",
    ),
    (
        "train",
        "Train config",
        "uniagent.train.config:TrainConfig",
        "`uniagent train --engine local|verl --config FILE.yaml [--set KEY=VALUE ...]`",
    ),
    (
        "verl",
        "verl agent loop",
        "uniagent.integrations.verl.settings:UniAgentLoopSettings",
        "the agent-loop YAML entry of `UniAgentLoop`, or `+uniagent.KEY=VALUE` on a verl command line",
    ),
    (
        "session",
        "Gateway session",
        "uniagent.gateway.sessions:SessionConfig",
        "the JSON body of the gateway's `POST /sessions`",
    ),
    (
        "harness",
        "Harness CLI preset file",
        "uniagent.harness.cli_agent:CliConfig",
        "`--agent claude-code:FILE.yaml` / `--agent codex:FILE.yaml`",
    ),
]


def _import(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _cell(text: str) -> str:
    """Text safe inside one markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_name(tp: Any) -> str:
    """An annotation as a reader writes it: `int | None`, `list[str]`, `"a" | "b"`."""
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _constraints(field: FieldInfo) -> str:
    """`≥ 1`, `> 0, ≤ 1`: the bounds pydantic checks."""
    marks = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "pattern": "matches"}
    out = []
    for meta in field.metadata:
        for attr, sign in marks.items():
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {value}")
    return ", ".join(out)


def _value(value: Any) -> str:
    """A default as it would be written in the YAML file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, default=str)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{_value(value)}`"


def _sub_model(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return None


def _doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if doc else ""


def _sandbox_backends() -> list[type[BaseModel]]:
    """Every sandbox backend's config class, in the backend registry's order (one `type` each;
    each lives in its backend's module)."""
    from uniagent.sandbox.registry import BACKENDS

    return [BACKENDS.entry(name).config_class() for name in BACKENDS.names()]  # type: ignore[attr-defined]


_SANDBOX_DOCUMENTED: dict[str, str] = {}
"""The sandbox union is the same wherever a config has one: documented once, linked after."""


def _row(key: str, field: FieldInfo, instance: BaseModel | None) -> str:
    """One table row: key, type with its bounds, default, description."""
    kind = _type_name(field.annotation)
    bounds = _constraints(field)
    if bounds:
        kind += f" ({bounds})"
    name = key.rpartition(".")[2]
    default = f"`{_value(getattr(instance, name))}`" if instance is not None else _default(field)
    return f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(field.description or '')} |"


def _instance(field: FieldInfo) -> BaseModel | None:
    """The section a field defaults to, when it has one (a train config's `agent` is an
    AgentConfig with other budgets than AgentConfig's own defaults)."""
    try:
        value = field.get_default(call_default_factory=True)
    except Exception:  # a factory that needs arguments: show the class defaults
        return None
    return value if isinstance(value, BaseModel) else None


def _model_section(
    cls: type[BaseModel],
    root: str,
    prefix: str,
    level: int,
    out: list[str],
    instance: BaseModel | None = None,
    fields: dict[str, FieldInfo] | None = None,
) -> None:
    """One table for `cls`'s plain fields, then a subsection per nested model (or sandbox)."""
    from uniagent.sandbox.config import SandboxConfig, as_written

    if prefix:  # the root's own heading is its title
        out.append(f"{'#' * level} `{prefix}` {{#{_anchor(root, prefix)}}}\n")
    doc = _doc(cls)
    if doc:
        out.append(doc + "\n")
    out.append(f"*{cls.__module__}.{cls.__name__}*\n")
    rows, nested = [], []
    for name, field in (fields or cls.model_fields).items():
        key = f"{prefix}.{name}" if prefix else name
        sub = _sub_model(field.annotation)
        if name == "sandbox" and sub is not None and issubclass(sub, SandboxConfig):  # a typed section
            where = _SANDBOX_DOCUMENTED.setdefault(key, _anchor(root, key))
            if where == _anchor(root, key):
                nested.append((key, None, None))
            default = as_written(field.get_default(call_default_factory=True))
            rows.append(
                f"| `{key}` | mapping | `{_value(default)}` | the sandbox backend and its settings; "
                f"see [`{key}`](#{where}) |"
            )
        elif sub is not None:
            value = getattr(instance, name) if instance is not None else _instance(field)
            nested.append((key, sub, value))
            rows.append(f"| `{key}` | section | | see [`{key}`](#{_anchor(root, key)}) |")
        else:
            rows.append(_row(key, field, instance))
    out.append("| key | type | default | description |\n|---|---|---|---|")
    out.extend(rows)
    out.append("")
    for key, sub, value in nested:
        if sub is None:
            _sandbox_section(root, key, level + 1, out)
        else:
            _model_section(sub, root, key, level + 1, out, value)


def _differs(field: FieldInfo, base: FieldInfo | None) -> bool:
    """A backend's field that is its own, or a common one it redefines (host's `workdir`)."""
    if base is None:
        return True
    return (field.annotation, field.default, field.description) != (
        base.annotation,
        base.default,
        base.description,
    )


def _anchor(root: str, key: str) -> str:
    """A heading's explicit id, unique on the page (`run-agent-context`): several roots have an
    `agent` section."""
    return "-".join(p for p in (root, *key.split(".")) if p).replace("_", "-").lower()


def _sandbox_section(root: str, key: str, level: int, out: list[str]) -> None:
    """The `sandbox` mapping: a table per backend `type` (its own keys first), then the
    limits every backend shares."""
    from uniagent.sandbox.settings import Limits, SandboxConfig

    out.append(f"{'#' * level} `{key}` {{#{_anchor(root, key)}}}\n")
    backends = _sandbox_backends()
    names = ", ".join(f"`{cls.model_fields['type'].default}`" for cls in backends)
    out.append(
        f"A mapping with a `type` ({names}; default `local`) and that backend's settings; a backend "
        f"rejects keys it does not have. Every backend has the common keys, then its own.\n"
    )
    common = SandboxConfig.model_fields
    out.append(f"{'#' * (level + 1)} common keys {{#{_anchor(root, key)}-common}}\n")
    out.append(_doc(SandboxConfig) + "\n")
    out.append("| key | type | default | description |\n|---|---|---|---|")
    for n, f in common.items():
        if _sub_model(f.annotation) is not None:
            out.append(f"| `{key}.{n}` | section | | see [`{key}.{n}`](#{_anchor(root, key + '.' + n)}) |")
        else:
            out.append(_row(f"{key}.{n}", f, None))
    out.append("")
    _model_section(Limits, root, f"{key}.limits", level + 2, out)
    for cls in backends:
        name = cls.model_fields["type"].default
        own = {n: f for n, f in cls.model_fields.items() if n == "type" or _differs(f, common.get(n))}
        out.append(f"{'#' * (level + 1)} `{key}` type `{name}` {{#{_anchor(root, key)}-{name}}}\n")
        doc = _doc(cls)
        if doc:
            out.append(doc + "\n")
        out.append(f"*{cls.__module__}.{cls.__name__}*\n")
        out.append("| key | type | default | description |\n|---|---|---|---|")
        out.extend(_row(f"{key}.{n}", f, None) for n, f in own.items())
        out.append("")


def config_reference() -> str:
    """The configuration reference page, from the pydantic models."""
    out = [
        "# Configuration reference\n",
        "Generated from the pydantic settings models when the manual is built; every section rejects "
        'unknown keys (`extra="forbid"`), so a misspelt key is an error naming it. Keys are dotted as '
        "`--set` takes them (`--set agent.context.policy=window`); values are YAML.\n",
    ]
    _SANDBOX_DOCUMENTED.clear()
    for root, title, ref, how in CONFIG_ROOTS:
        cls = _import(ref)
        out.append(f"## {title} {{#{root}}}\n")
        out.append(f"Given as {how}.\n")
        _model_section(cls, root, "", 2, out)
    return "\n".join(out) + "\n"


def _param_type(param: Any, ctx: Any) -> str:
    """`int (≥ 1)`, `path`, `flag`: what the option takes, bounds included."""
    if getattr(param, "is_flag", False):
        return "flag"
    kind = param.display_type(ctx).strip("<>").replace(" range", "").replace("Path", "path")
    repeatable = getattr(param, "multiple", False) or param.nargs == -1
    if repeatable and kind.startswith("list[") and kind.endswith("]"):
        kind = kind[5:-1]
    limits = (("≥", getattr(param, "min", None)), ("≤", getattr(param, "max", None)))
    bounds = [f"{sign} {value}" for sign, value in limits if value is not None]
    if bounds:
        kind += f" ({', '.join(bounds)})"
    return kind + (", repeatable" if repeatable else "")


def _param_row(param: Any, ctx: Any) -> str:
    if param.param_type_name == "argument":
        name = f"`{param.name.upper()}`"
    else:
        name = " / ".join(f"`{f}`" for f in [*param.opts, *param.secondary_opts])
    default = param.default
    if param.required:
        shown = "(required)"
    elif default is None or default == () or default == [] or callable(default):
        shown = ""
    elif isinstance(default, bool):
        shown = f"`{str(default).lower()}`"
    else:
        shown = f"`{default}`"
    return f"| {name} | {_cell(_param_type(param, ctx))} | {_cell(shown)} | {_cell(param.help or '')} |"


def _command_section(cmd: Any, path: list[str], parent: Any, out: list[str]) -> None:
    """A command's heading, help, usage and options; a group's subcommands after it."""
    name = " ".join(path)
    out.append(f"{'#' * min(len(path), 6)} `{name}`\n")
    help_text = inspect.cleandoc(cmd.help or "")
    if help_text:
        out.append(help_text.replace("\b\n", "") + "\n")
    ctx = type(parent)(cmd, info_name=path[-1], parent=parent)
    words = [name, "[OPTIONS]"]
    for p in cmd.params:
        if p.param_type_name == "argument":
            word = p.name.upper() + ("..." if p.nargs == -1 else "")
            words.append(word if p.required else f"[{word}]")
    if (cmd.context_settings or {}).get("allow_extra_args") and not hasattr(cmd, "list_commands"):
        words.append("[ARGS]...")
    if hasattr(cmd, "list_commands"):
        words.append("COMMAND [ARGS]...")
    out.append("```\n" + " ".join(words) + "\n```\n")
    params = [p for p in cmd.params if not getattr(p, "hidden", False)]
    if params:
        out.append("| option | type | default | help |\n|---|---|---|---|")
        out.extend(_param_row(p, ctx) for p in params)
        out.append("")
    if hasattr(cmd, "list_commands"):
        for sub_name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                _command_section(sub, [*path, sub_name], ctx, out)


def cli_reference() -> str:
    """The CLI reference page, from the Typer app."""
    import typer

    from uniagent.cli import app

    group = typer.main.get_command(app)
    out = [
        "# CLI reference\n",
        "Generated from the `uniagent` Typer app when the manual is built; `uniagent COMMAND --help` "
        "prints the same.\n",
    ]
    ctx = group.make_context("uniagent", [], resilient_parsing=True)
    if group.help:
        out.append(inspect.cleandoc(group.help) + "\n")
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is not None and not cmd.hidden:
            _command_section(cmd, ["uniagent", name], ctx, out)
    return "\n".join(out) + "\n"


PAGES = {"reference/configuration.md": config_reference, "reference/cli.md": cli_reference}


def _use_this_tree() -> None:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    for name in [m for m in sys.modules if m == "uniagent" or m.startswith("uniagent.")]:
        if not str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(SRC)):
            del sys.modules[name]  # an installed copy imported earlier: this tree's code wins


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated pages to the build (they exist only in memory)."""
    from mkdocs.structure.files import File

    _use_this_tree()
    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files


if __name__ == "__main__":  # print a page: python docs/hooks/gen_reference.py reference/cli.md
    _use_this_tree()
    print(PAGES[sys.argv[1] if len(sys.argv) > 1 else "reference/configuration.md"]())
