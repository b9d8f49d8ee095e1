"""Getting a repository into a sandbox at its base commit, with nothing newer to read.

A repository's future is the answer key: later commits, tags, remote branches, the reflog
and stashes can all contain the fix. Before the agent starts, every ref is deleted, one
branch is made at the base commit, and unreachable objects are pruned.
"""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from pathlib import Path

from uniagent.errors import ConfigError, SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.procs import quote

GIT = (
    "git -c safe.directory='*' -c user.name=uniagent -c user.email=uniagent@localhost "
    "-c init.defaultBranch=main"
)


async def run_checked(
    sandbox: Sandbox, script: str, what: str, timeout: float = 600, cwd: str | None = None
) -> str:
    res = await sandbox.exec(
        script, timeout=timeout, cwd=cwd or sandbox.workdir, session="_setup", max_output=20_000
    )
    if not res.ok:
        raise SandboxError(f"{what} failed (exit {res.exit_code}): {res.output.strip()[-1500:]}")
    return res.output


async def copy_repo(sandbox: Sandbox, src: Path) -> None:
    """Put a directory, git repo or .tar.gz into the sandbox's workdir."""
    if src.is_dir():
        await sandbox.upload(src, sandbox.workdir)
        return
    if src.name.endswith((".tar.gz", ".tgz")):
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(src) as tar:
            tar.extractall(tmp, filter="data")
            entries = list(Path(tmp).iterdir())
            root = entries[0] if len(entries) == 1 and entries[0].is_dir() else Path(tmp)
            await sandbox.upload(root, sandbox.workdir)
        return
    raise SandboxError(f"repo_dir {src} is neither a directory nor a .tar.gz")


def check_base_commit(src: Path | None, base_commit: str, instance_id: str) -> None:
    """A row's base commit must exist in its local git repository (checked when the row is
    loaded; a tarball's repository is checked when it is set up). A directory without `.git`
    is a snapshot: it is its own base, and the row's base commit is not looked up."""
    if src is None or not (src / ".git").exists():
        return
    res = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(src), "cat-file", "-e", f"{base_commit}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise ConfigError(f"{instance_id}: base_commit {base_commit} is not a commit of the repository {src}")


async def prepare_base(
    sandbox: Sandbox, base_commit: str | None = None, instance_id: str = "the task"
) -> str:
    """Make the workdir a git repo at its base commit with no later history; return the sha.
    A workdir without a git repository is a snapshot and becomes its own base commit."""
    w = sandbox.workdir
    has_git = (await sandbox.exec(f"test -d {quote(w)}/.git", session="_setup")).exit_code == 0
    if not has_git:
        await run_checked(
            sandbox,
            # A fixed date makes the base commit's sha a function of the content alone.
            "export GIT_AUTHOR_DATE='2000-01-01T00:00:00Z' GIT_COMMITTER_DATE='2000-01-01T00:00:00Z'; "
            f"{GIT} init -q && {GIT} add -A && {GIT} commit -q --no-verify -m base",
            "creating the base commit",
        )
    else:
        target = quote(f"{base_commit or 'HEAD'}^{{commit}}")
        found = await sandbox.exec(f"{GIT} cat-file -e {target}", cwd=w, session="_setup")
        if not found.ok:  # a row that names a commit its repository does not have
            raise SandboxError(
                f"{instance_id}: base_commit {base_commit or 'HEAD'} is not a commit of the task's repository"
            )
        await run_checked(
            sandbox,
            "\n".join(
                [
                    f"{GIT} reset -q --hard && {GIT} checkout -q --detach {target} || exit 1",
                    f"{GIT} for-each-ref --format='%(refname)' | "
                    f'while read -r r; do {GIT} update-ref -d "$r"; done',
                    f"{GIT} checkout -q -B main",
                    f'for r in $({GIT} remote); do {GIT} remote remove "$r"; done',
                    f"{GIT} stash clear 2>/dev/null; {GIT} reflog expire --expire=now --all",
                    "rm -f .git/ORIG_HEAD .git/FETCH_HEAD .git/MERGE_HEAD .git/packed-refs.bak",
                    f"{GIT} gc -q --prune=now 2>/dev/null || true",
                ]
            ),
            "scrubbing git history newer than the base commit",
        )
    return (await run_checked(sandbox, f"{GIT} rev-parse HEAD", "reading the base commit")).strip()


async def reset_to_base(sandbox: Sandbox, base: str) -> None:
    await run_checked(
        sandbox, f"{GIT} reset -q --hard {quote(base)} && {GIT} clean -q -fdx", "resetting to base"
    )


async def apply_patch(sandbox: Sandbox, patch: str, name: str) -> tuple[bool, str]:
    """`git apply` a patch (with a fuzzier `patch` fallback, as SWE-bench's harness does)."""
    if not patch.strip():
        return True, ""
    path = f"/tmp/.uniagent_{name}.diff"
    await sandbox.write_file(path, patch.encode("utf-8", errors="surrogateescape"))
    res = await sandbox.exec(
        f"{GIT} apply --whitespace=nowarn {path} 2>&1 || patch --batch --fuzz=5 -p1 -i {path} 2>&1",
        timeout=300,
        cwd=sandbox.workdir,
        session="_setup",
        max_output=10_000,
    )
    return res.ok, res.output
