"""R2E-Gym's ParsedCommit (a row's `parsed_commit_content`) back to `git diff` text, restricted
as R2E-Gym restricts it: the gold patch is the commit's non-test Python diff, its test-file diff
protects those files."""

from __future__ import annotations

from typing import Any


def is_r2e_test_file(path: str) -> bool:
    """R2E-Gym's notion of a test file in a commit (FileDiff.is_test_file)."""
    parts = path.split("/")
    return (
        path.endswith("_test.py")
        or parts[-1].startswith("test_")
        or any(p in ("tests", "Tests", "test", "Test") for p in parts)
    )


def _range(r: dict[str, Any]) -> str:
    return str(r["start"]) if r.get("length") is None else f"{r['start']},{r['length']}"


_LINE_PREFIX = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}


def render_file_diff(fd: dict[str, Any]) -> str:
    """One FileDiff of a ParsedCommit back to `git diff` text."""
    path = fd["header"]["file"]["path"]
    out = [f"diff --git a/{path} b/{path}\n"]
    if fd["header"].get("misc_line"):
        out.append(fd["header"]["misc_line"] + "\n")
    idx = fd.get("index_line")
    if idx:
        mode = f" {idx['mode']}" if idx.get("mode") else ""
        out.append(f"index {idx['old_commit_hash']}..{idx['new_commit_hash']}{mode}\n")
    if fd.get("is_binary_file"):
        out.append(f"{fd.get('binary_line') or ''}\n")
    if fd.get("minus_file") and fd.get("plus_file"):
        out.append(f"--- {fd['minus_file']['path']}\n+++ {fd['plus_file']['path']}\n")
    for hunk in fd.get("hunks") or []:
        d = hunk["descriptor"]
        head = f"@@ -{_range(d['old_range'])} +{_range(d['new_range'])} @@"
        out.append(f"{head} {d['section']}\n" if d.get("section") else head + "\n")
        for line in hunk["line_group"]["all_lines"]:
            out.append(_LINE_PREFIX[line["type"]] + line["content"] + "\n")
    return "".join(out)


def commit_patch(commit: dict[str, Any], *, tests: bool, sources: bool, only_python: bool = True) -> str:
    """The commit's diff restricted as R2E-Gym's ParsedCommit.get_patch restricts it."""
    chunks = []
    for fd in commit.get("file_diffs") or []:
        path = fd["header"]["file"]["path"]
        if only_python and not path.endswith(".py"):
            continue
        if tests if is_r2e_test_file(path) else sources:
            chunks.append(render_file_diff(fd))
    return "".join(chunks)
