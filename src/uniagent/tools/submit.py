"""Tools that end the episode: `submit` (code tasks; optionally with the workspace diff) and
`finish` (question answering; with the answer)."""

from __future__ import annotations

import logging
import posixpath
import secrets

from pydantic import BaseModel, ConfigDict, Field

from uniagent.errors import SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.procs import quote
from uniagent.tools.base import NoArgs, Tool, ToolResult

log = logging.getLogger(__name__)


class SubmitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_ref: str | None = Field(
        None, description="git ref to diff the workspace against (e.g. HEAD or a commit); unset: no patch"
    )
    repo_dir: str | None = Field(None, description="the git checkout; unset: the sandbox's workdir")
    exclude: list[str] = Field(
        default_factory=list, description="pathspecs (relative to repo_dir) to leave out of the patch"
    )
    timeout_s: float = Field(300.0, gt=0)


class SubmitTool(Tool):
    name = "submit"
    description = "Submit your changes and end the task. Call it once you are done; nothing runs after it."
    Args = NoArgs
    Config = SubmitConfig
    config: SubmitConfig

    async def run(self, args: NoArgs, sandbox: Sandbox) -> ToolResult:
        if self.config.base_ref is None:
            return ToolResult("Submitted. The task is over.", done=True)
        try:
            patch = await workspace_patch(
                sandbox,
                self.config.base_ref,
                self.config.repo_dir or sandbox.workdir,
                self.config.exclude,
                self.config.timeout_s,
            )
        except SandboxError as exc:
            # The episode ends either way (the model asked for it); the verifier sees no patch
            # and the reason is kept, rather than the model being asked to fix what it cannot.
            log.warning("submit: could not compute the patch: %s", exc)
            return ToolResult(
                "Submitted, but the patch could not be computed.",
                status="error",
                done=True,
                metadata={"patch_error": str(exc)},
            )
        text = "Submitted. The task is over." if patch else "Submitted (with no changes). The task is over."
        return ToolResult(text, done=True, patch=patch, metadata={"patch_bytes": len(patch.encode())})


def _inside(path: str, root: str) -> str | None:
    rel = posixpath.relpath(posixpath.normpath(path), posixpath.normpath(root))
    return None if rel == "." or rel.startswith("..") else rel


async def workspace_patch(
    sandbox: Sandbox, base_ref: str, repo_dir: str, exclude: list[str] | None = None, timeout: float = 300
) -> str:
    """`git diff --binary base_ref` of the working tree, untracked (not ignored) files included.

    The files are staged into a throwaway copy of the index (GIT_INDEX_FILE), so the repo's
    own index, and whatever the model staged, is untouched. The patch is written to a file and
    read back with `read_file`, because shell output is cleaned for the model (ANSI codes and
    CRLF are rewritten) and a patch must keep every byte; bytes that are not UTF-8 survive
    as surrogates (`patch.encode("utf-8", "surrogateescape")` gives them back).
    """
    repo_dir = posixpath.join(sandbox.workdir, repo_dir)
    specs = [".", *(f":(exclude){p}" for p in exclude or [])]
    tools = _inside(sandbox.tools_dir, repo_dir)
    if tools:
        specs.append(f":(exclude){tools}")  # tool scripts are ours, not the model's work
    tmp = f"/tmp/.uniagent_submit_{secrets.token_hex(8)}"
    git = "git -c safe.directory='*' -c core.quotepath=false"
    script = "\n".join(
        [
            f"mkdir -p {tmp} || exit 1",
            "idx=$(git rev-parse --git-path index) || exit 1",
            # -p keeps the index's mtime: git trusts a file's cached stat only when the file is
            # older than the index (else it compares contents), so a copy stamped "now" would hide
            # a same-size edit made in the second of the checkout from the patch.
            f'if [ -f "$idx" ]; then cp -p "$idx" {tmp}/index; fi',
            f"export GIT_INDEX_FILE={tmp}/index",
            f"{git} add -A -- {' '.join(quote(s) for s in specs)} || exit 1",
            f"{git} diff --cached --binary --no-color --no-ext-diff {quote(base_ref)} -- > {tmp}/patch",
        ]
    )
    try:
        res = await sandbox.exec(script, timeout=timeout, cwd=repo_dir, session="_tools", max_output=None)
        if not res.ok:
            raise SandboxError(
                f"git diff against {base_ref!r} in {repo_dir} failed (exit {res.exit_code}): "
                f"{res.output.strip()[-1000:]}"
            )
        return (await sandbox.read_file(f"{tmp}/patch")).decode("utf-8", errors="surrogateescape")
    finally:
        await sandbox.exec(f"rm -rf {tmp}", timeout=60, session="_tools")


class FinishArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: str = Field(description="Your final answer, as short as the question allows.")


class FinishTool(Tool):
    name = "finish"
    description = "Give your final answer and end the task."
    Args = FinishArgs

    async def run(self, args: FinishArgs, sandbox: Sandbox) -> ToolResult:
        return ToolResult("Answer recorded. The task is over.", done=True, answer=args.answer)
