"""`str_replace_editor`: view, create and edit files in the sandbox.

All the editing happens in one stdlib-only script (`scripts/str_replace_editor.py`) run
with the sandbox's own python3, so the same code serves this tool and black-box harnesses
that only have a shell (`str_replace_editor view file.py` once the script is on PATH).
Arguments travel as base64 JSON in argv (or a temp file when large), so no text the model
writes is ever parsed by a shell.
"""

from __future__ import annotations

import base64
import json
import secrets
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.procs import quote
from uniagent.tools.base import Tool, ToolResult

SCRIPT_NAME = "str_replace_editor"
_MISSING = "__UA_EDITOR_SCRIPT_MISSING__"
_NO_PYTHON = (
    "str_replace_editor needs python3 in the sandbox and there is none; edit files with bash "
    "instead (cat, sed, or a heredoc: cat > file <<'EOF' ... EOF)."
)
# Linux caps one argv string at 128 KiB; bigger requests go through a file.
_MAX_ARGV = 100_000


@cache
def script_source() -> bytes:
    return resources.files("uniagent.tools").joinpath("scripts", "str_replace_editor.py").read_bytes()


class EditorArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: Literal["view", "create", "str_replace", "insert", "undo_edit"] = Field(
        description="view: show a file with line numbers, or list a directory; create: make a new "
        "file; str_replace: replace old_str (must match exactly once) with new_str; insert: add "
        "new_str after line insert_line; undo_edit: revert the last edit of path."
    )
    path: str = Field(description="File or directory; relative paths start at the working directory.")
    file_text: str | None = Field(None, description="create: the content of the new file.")
    old_str: str | None = Field(
        None, description="str_replace: the exact text to replace, whitespace included."
    )
    new_str: str | None = Field(
        None, description="str_replace: the replacement (empty deletes old_str); insert: the text to insert."
    )
    insert_line: int | None = Field(
        None, ge=0, description="insert: new_str goes after this line (0 = top of the file)."
    )
    view_range: list[int] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="view: [start, end] line numbers, 1-based and inclusive; end -1 means to the end.",
    )


class EditorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_view_chars: int = Field(16_000, ge=1000, description="longer views are clipped, with a note")


class EditorTool(Tool):
    name = "str_replace_editor"
    description = (
        "View, create and edit text files. `view` shows a file with line numbers (use view_range "
        "for a part of a large file) or lists a directory 2 levels deep. `str_replace` replaces "
        "old_str, which must appear exactly once in the file, with new_str. `insert` adds new_str "
        "after line insert_line. `create` makes a new file (it never overwrites). `undo_edit` "
        "reverts the last edit of a file."
    )
    Args = EditorArgs
    Config = EditorConfig
    config: EditorConfig

    def script(self) -> tuple[str, bytes]:
        return SCRIPT_NAME, script_source()

    async def run(self, args: EditorArgs, sandbox: Sandbox) -> ToolResult:
        request = args.model_dump(exclude_none=True)
        request["workdir"] = sandbox.workdir
        request["max_view_chars"] = self.config.max_view_chars
        for attempt in range(2):
            path = await self.ensure_script(sandbox, force=attempt > 0)
            res = await sandbox.exec(
                await self._command(path, request, sandbox), timeout=self.command_timeout_s, session="_tools"
            )
            if _MISSING not in res.output:
                break
        text = res.output.rstrip("\n")
        if res.timed_out:
            return ToolResult(text, status="timeout", metadata={"exit_code": None})
        status = "ok" if res.exit_code == 0 else "error"
        return ToolResult(text, status=status, metadata={"exit_code": res.exit_code, "command": args.command})

    async def _command(self, script: str, request: dict[str, object], sandbox: Sandbox) -> str:
        payload = base64.b64encode(json.dumps(request).encode()).decode()
        if len(payload) <= _MAX_ARGV:
            args = f"--json-b64 {payload}"
        else:
            tmp = f"/tmp/.uniagent_editor/request-{secrets.token_hex(8)}.json"
            await sandbox.write_file(tmp, json.dumps(request))
            args = f"--json-file {quote(tmp)}"
        # A deleted script is reinstalled (the caller sees _MISSING); a sandbox without Python
        # gets a message the model can act on rather than "command not found".
        return (
            f"if [ ! -f {quote(script)} ]; then echo {_MISSING}; false; "
            "elif ! command -v python3 >/dev/null && ! command -v python >/dev/null; then "
            f"echo {quote(_NO_PYTHON)}; false; "
            f'else "$(command -v python3 || command -v python)" {quote(script)} {args}; fi'
        )
