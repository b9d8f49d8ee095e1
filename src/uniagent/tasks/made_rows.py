"""The rows `uniagent tasks make` writes, and the repository they run in.

One git repository holds every task: the clean tree is one commit, and each kept bug is an
orphan commit (no parent) of the clean tree with the bug in it, under `refs/made/ID`. A row names
its bug's commit as `base_commit`; setting a task up (`uniagent.tasks.repo.prepare_base`) deletes
every ref and prunes what the base commit does not reach, so the clean commit and the other bugs
are gone from the agent's copy. The gold patch is the revert (bug commit -> clean commit), the
test patch is empty (the failing tests are the repository's own).

The problem statement says what fails (the failing tests and their errors), never where or
what the change was; with `statement_model`, a model rewrites it as an issue report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from uniagent import jsonio
from uniagent.tasks.mutate import Mutation

_DATE = "2000-01-01T00:00:00Z"
_ENV = {
    "GIT_AUTHOR_NAME": "uniagent",
    "GIT_AUTHOR_EMAIL": "uniagent@localhost",
    "GIT_COMMITTER_NAME": "uniagent",
    "GIT_COMMITTER_EMAIL": "uniagent@localhost",
    "GIT_AUTHOR_DATE": _DATE,
    "GIT_COMMITTER_DATE": _DATE,
}
MAX_LISTED = 6

STATEMENT = """{count} of the test suite of `{name}` fail{s}; the rest of the suite passes.

{listing}

The tests are right: fix the library's source code so that they pass again."""

MODEL_PROMPT = """Write a short GitHub issue for the Python library `{name}`, as a user who hit the \
failures below would. Say what goes wrong and what was expected, using the tests' errors; do not \
guess at the cause or the fix and do not name source files or lines. Answer with the issue text only.

Failing tests and their errors:
{listing}"""


def _git(repo: Path, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(
        ["git", "-c", "safe.directory=*", "-c", "init.defaultBranch=main", "-C", str(repo), *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, **_ENV, **(env or {})},
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])} failed: {res.stderr.decode()[-400:]}")
    return res.stdout.decode()


def listing(failures: dict[str, str]) -> str:
    lines = [f"- `{t}`: {msg}" if msg else f"- `{t}`" for t, msg in list(failures.items())[:MAX_LISTED]]
    if len(failures) > MAX_LISTED:
        lines.append(f"- ... and {len(failures) - MAX_LISTED} more")
    return "\n".join(lines)


def statement(name: str, failures: dict[str, str]) -> str:
    n = len(failures)
    return STATEMENT.format(
        count=f"{n} test{'s' if n > 1 else ''}",
        name=name,
        s="" if n > 1 else "s",
        listing=listing(failures),
    )


async def model_statements(spec: str, name: str, kept: list[dict[str, Any]]) -> dict[str, str]:
    """Issue-style statements written by the model of `spec` (any `ModelConfig.spec`, e.g. an
    OpenAI-compatible `openai:URL`), one per kept bug."""
    from uniagent.models.config import ModelConfig
    from uniagent.models.factory import ModelFactory

    factory = ModelFactory(ModelConfig(spec=spec, temperature=0.3, max_tokens=400))
    await factory.start()
    out: dict[str, str] = {}
    try:
        for r in kept:
            model = factory.new_model(r["id"], 0)
            prompt = MODEL_PROMPT.format(name=name, listing=listing(r["failures"]))
            turn = await model.query([{"role": "user", "content": prompt}])
            text = (turn.text or "").strip()
            out[r["id"]] = text or statement(name, r["failures"])
    finally:
        await factory.close()
    return out


def build_repo(tree: Path, repo: Path, kept: list[dict[str, Any]]) -> tuple[str, dict[str, tuple[str, str]]]:
    """The tasks' repository: the clean commit, and per kept bug (id -> (bug commit, gold patch))."""
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(tree, repo, symlinks=True)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A", "--force")  # the tree as it is: ignored files too (a generated version.py)
    _git(repo, "commit", "-q", "--no-verify", "-m", "clean")
    clean = _git(repo, "rev-parse", "HEAD").strip()
    index = repo / ".git" / "made-index"
    out: dict[str, tuple[str, str]] = {}
    for r in kept:
        m = Mutation(**{k: v for k, v in r["mutation"].items() if k != "id"})
        text = (tree / m.path).read_text(encoding="utf-8")
        blob = _git(repo, "hash-object", "-w", "--stdin", stdin=m.apply(text).encode()).strip()
        mode = _git(repo, "ls-files", "-s", "--", m.path).split()[0]
        env = {"GIT_INDEX_FILE": str(index)}
        _git(repo, "read-tree", clean, env=env)
        _git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{m.path}", env=env)
        tree_sha = _git(repo, "write-tree", env=env).strip()
        bug = _git(repo, "commit-tree", tree_sha, "-m", "base").strip()
        _git(repo, "update-ref", f"refs/made/{r['id']}", bug)
        out[r["id"]] = (bug, _git(repo, "diff", bug, clean))
    index.unlink(missing_ok=True)
    _git(repo, "gc", "-q")
    return clean, out


async def write(
    out: Path,
    name: str,
    tree: Path,
    kept: list[dict[str, Any]],
    test: tuple[str, str],
    statement_model: str | None = None,
) -> list[dict[str, Any]]:
    """Build OUT/repo and write OUT/tasks.jsonl (ids NAME-ID; `test`: the test command and its
    log parser); the rows."""
    test_cmd, log_parser = test
    out.mkdir(parents=True, exist_ok=True)
    _, commits = build_repo(tree, out / "repo", kept)
    texts = await model_statements(statement_model, name, kept) if statement_model else {}
    rows = []
    for r in kept:
        bug, gold = commits[r["id"]]
        m = r["mutation"]
        rows.append(
            {
                "instance_id": f"{name}-{r['id']}",
                "repo_dir": "repo",
                "base_commit": bug,
                "problem_statement": texts.get(r["id"]) or statement(name, r["failures"]),
                "patch": gold,
                "test_patch": "",
                "FAIL_TO_PASS": r["FAIL_TO_PASS"],
                "PASS_TO_PASS": r["PASS_TO_PASS"],
                "test_cmd": test_cmd,
                "log_parser": log_parser,
                "made": {k: m[k] for k in ("kind", "path", "function", "line")},
            }
        )
    jsonio.write_text_atomic(out / "tasks.jsonl", "".join(jsonio.dumps(row) + "\n" for row in rows))
    return rows


def pack(out: Path) -> Path:
    """OUT/repo as OUT/repo.tar.gz (one file, e.g. for a bundled suite), the rows pointed at it;
    the rows also as OUT/tasks.parquet, some 30x smaller (every row lists the same tests)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = out / "repo.tar.gz"
    with jsonio.atomic_path(target) as tmp, tarfile.open(tmp, "w:gz") as tar:
        tar.add(out / "repo", arcname="repo")
    rows = [jsonio.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        row["repo_dir"] = "repo.tar.gz"
    jsonio.write_text_atomic(out / "tasks.jsonl", "".join(jsonio.dumps(row) + "\n" for row in rows))
    with jsonio.atomic_path(out / "tasks.parquet") as tmp:
        pq.write_table(pa.Table.from_pylist(rows), tmp, compression="zstd", compression_level=19)
    return target
