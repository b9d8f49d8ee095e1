"""R2E-Gym tasks (R2E-Gym/R2E-Gym-Lite, -Subset, -V1 rows; R2E-Gym/SWE-Bench-Verified rows).

An R2E-Gym row names a prebuilt image (`docker_image`; `image_name` in some exports) whose
repository is at `/testbed`, checked out at the commit before the fix. The image also holds the
verifier: `/testbed/run_tests.sh` (for example `.venv/bin/python -W ignore -m pytest -rA
r2e_tests`) and the hidden tests in `/r2e_tests`. R2E-Gym moves both out of the agent's view
before the episode and, to grade, runs `run_tests.sh` from `/testbed` with the hidden tests
linked back in as `/testbed/r2e_tests`, parses pytest's "short test summary info" section and
compares each test's status with the row's `expected_output_json` (the statuses the fix commit
itself produces, failures included): the reward is 1.0 only when every status matches.

Here the hidden files are read out of the sandbox and deleted before the agent starts, so
neither the files nor the git history hold them. To grade, the agent's work is taken as a patch
against the base commit (without test files, `conftest.py` & co, or anything under
`r2e_tests/`), the repository is reset and the patch re-applied, the hidden tests and
`run_tests.sh` are put back from the copy taken at setup, and R2E-Gym's parser and comparison
decide. A run that exits non-zero while reporting no failing test does not count as a pass
(an agent's code can print summary lines of its own).

Rows whose image is a SWE-bench image ("swebench" in its name: R2E-Gym/SWE-Bench-Verified) are
graded as R2E-Gym grades them: `/run_tests.sh` (the SWE-bench eval script) is run and its log
graded with the swebench parser for the repository against FAIL_TO_PASS / PASS_TO_PASS.

A row may name a local `repo_dir` instead of an image: a directory holding the repository,
`run_tests.sh`, and the hidden tests in the directory the row's `r2e_tests_dir` names
(default `r2e_tests`; a SWE-bench-style row has none, its run_tests.sh applies its test patch);
it runs in the local sandbox.
"""

from __future__ import annotations

import json
import posixpath
import re
import secrets
from typing import Any

from uniagent.agent.result import Reward
from uniagent.errors import ConfigError, SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.procs import quote
from uniagent.tasks import repo
from uniagent.tasks.loading import json_list
from uniagent.tasks.swe import LOG_LIMIT, PatchApplyError, SweTask, split_patch, strip_test_changes

WORKDIR = "/testbed"
HIDDEN_TESTS = "r2e_tests"
IMAGE_TESTS_DIR = "/r2e_tests"
SWEBENCH_RUN_TESTS = "/run_tests.sh"
TEST_TIMEOUT_S = 300  # what R2E-Gym gives run_tests.sh
# Never part of the agent's patch: the image's environment and the verifier's own files.
ENV_PATHS = (".venv", "install.sh", "run_tests.sh", HIDDEN_TESTS)
SUMMARY = "short test summary info"
_ISSUE = re.compile(r"\[ISSUE\](.*)\[/ISSUE\]", re.S)
_KEY_COLOR = re.compile(r"\x1b\[\d+m")
_ANSI_CR = re.compile(r"\x1b\[[0-9;]*m|\r")

# SWE-bench repositories and their swebench log parser, for R2E-Gym's SWE-bench rows that do not
# name one (R2E-Gym picks the parser by repository, as SWE-bench's harness did).
SWEBENCH_REPO_PARSERS = {
    "astropy/astropy": "parse_log_astropy",
    "django/django": "parse_log_django",
    "marshmallow-code/marshmallow": "parse_log_marshmallow",
    "matplotlib/matplotlib": "parse_log_matplotlib",
    "mwaskom/seaborn": "parse_log_seaborn",
    "pallets/flask": "parse_log_flask",
    "psf/requests": "parse_log_requests",
    "pvlib/pvlib-python": "parse_log_pvlib",
    "pydata/xarray": "parse_log_xarray",
    "pydicom/pydicom": "parse_log_pydicom",
    "pylint-dev/astroid": "parse_log_astroid",
    "pylint-dev/pylint": "parse_log_pylint",
    "pytest-dev/pytest": "parse_log_pytest",
    "pyvista/pyvista": "parse_log_pyvista",
    "scikit-learn/scikit-learn": "parse_log_scikit",
    "sphinx-doc/sphinx": "parse_log_sphinx",
    "sqlfluff/sqlfluff": "parse_log_sqlfluff",
    "sympy/sympy": "parse_log_sympy",
}


# -- R2E-Gym's log format ----------------------------------------------------------------
def parse_r2e_log(log: str) -> dict[str, str]:
    """Test statuses from pytest's short summary, keyed the way R2E-Gym keys them.

    Only the text after the first "short test summary info" (up to a second one) counts. A line
    is PASSED, FAILED or ERROR by the first of those words it contains; the key is the node id
    without its file (`r2e_tests/test_1.py::TestA::test_b` -> `TestA.test_b`), and for failures
    and errors without pytest's " - reason" tail.
    """
    _, found, rest = log.partition(SUMMARY)
    if not found:
        return {}
    statuses: dict[str, str] = {}
    for line in rest.split(SUMMARY, 1)[0].strip().split("\n"):
        status = next((s for s in ("PASSED", "FAILED", "ERROR") if s in line), None)
        if status is None:
            continue
        name = ".".join(line.split("::")[1:])
        statuses[name if status == "PASSED" else name.split(" - ")[0]] = status
    return statuses


def _normalized(statuses: dict[str, str]) -> dict[str, str]:
    plain = {_KEY_COLOR.sub("", k): v for k, v in statuses.items()}
    return {k.split(" - ")[0]: plain[k] for k in sorted(plain)}


def compare_r2e(parsed: dict[str, str], expected: dict[str, str]) -> tuple[bool, dict[str, Any]]:
    """R2E-Gym's verdict (every parsed test has its expected status, and as many tests ran as
    expected) and, for the report, what differs."""
    got, want = _normalized(parsed), _normalized(expected)
    match = len(got) == len(want) and all(k in want and got[k] == want[k] for k in got if k)
    diff = {
        "missing": sorted(k for k in want if k not in got),
        "unexpected": sorted(k for k in got if k and k not in want),
        "wrong_status": {
            k: {"expected": want[k], "got": got[k]} for k in got if k in want and got[k] != want[k]
        },
    }
    return match, diff


# -- R2E-Gym's ParsedCommit (parsed_commit_content) --------------------------------------
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


def _json_obj(value: Any, field: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{field} is not valid JSON") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{field} must be a JSON object")
    return value


def problem_text(statement: str) -> str:
    """R2E-Gym shows the agent what is between [ISSUE] and [/ISSUE] when the markers are there."""
    m = _ISSUE.search(statement)
    return m.group(1) if m else statement


class R2EGymTask(SweTask):
    family = "r2e_gym"
    patch_exclude = ENV_PATHS

    def __init__(self, row: dict[str, Any], source: str | None = None) -> None:
        image = str(row.get("docker_image") or row.get("image_name") or row.get("image") or "")
        if "swesmith" in image:
            raise ConfigError("SWE-smith rows are not R2E-Gym rows: load them with the `swe` family")
        self.mode = (
            "swebench"
            if "swebench" in image or ("expected_output_json" not in row and "FAIL_TO_PASS" in row)
            else "r2e"
        )
        commit_field = "parsed_commit_content" if "parsed_commit_content" in row else "parsed_commit"
        commit = _json_obj(row[commit_field], commit_field) if row.get(commit_field) else None
        instance_id = row.get("instance_id")
        if not instance_id:
            if not (row.get("repo_name") and row.get("commit_hash")):
                raise ConfigError("an r2e_gym row needs `instance_id`, or `repo_name` and `commit_hash`")
            instance_id = f"{row['repo_name']}__{row['commit_hash']}"
        if self.mode == "r2e":
            if not row.get("expected_output_json"):
                raise ConfigError(f"{instance_id}: an R2E-Gym row needs `expected_output_json`")
            expected = _json_obj(row["expected_output_json"], "expected_output_json")
            self.expected = {str(k): str(v) for k, v in expected.items()}
            log_parser = "pytest"  # not used: R2E-Gym's own summary parser grades these rows
            tests_patch = commit_patch(commit, tests=True, sources=False, only_python=False) if commit else ""
        else:
            self.expected = {}
            log_parser = row.get("log_parser") or SWEBENCH_REPO_PARSERS.get(str(row.get("repo")), "pytest")
            tests_patch = row.get("test_patch") or ""
        gold = row.get("patch") or (commit_patch(commit, tests=False, sources=True) if commit else "")
        normalized: dict[str, Any] = {
            **row,
            "instance_id": instance_id,
            "problem_statement": problem_text(str(row.get("problem_statement") or "")),
            "workdir": row.get("workdir") or WORKDIR,
            "test_cmd": "bash run_tests.sh",
            "log_parser": log_parser,
            "patch": gold,
            "test_patch": tests_patch,
            "FAIL_TO_PASS": json_list(row.get("FAIL_TO_PASS"), "FAIL_TO_PASS"),
            "PASS_TO_PASS": json_list(row.get("PASS_TO_PASS"), "PASS_TO_PASS"),
        }
        if image:
            normalized["image"] = image
        super().__init__(normalized, source)
        self.commit = commit
        self.hidden_tests_dir = str(row.get("r2e_tests_dir") or HIDDEN_TESTS)
        self.test_timeout_s = float(row.get("test_timeout_s") or TEST_TIMEOUT_S)
        self._hidden: bytes | None = None

    # -- where the verifier's files are in a fresh sandbox ---------------------------------
    def _hidden_sources(self, sandbox: Sandbox) -> tuple[str, str | None]:
        w = sandbox.workdir
        local = bool(self.row.get("repo_dir"))
        if self.mode == "swebench":
            default = posixpath.join(w, "run_tests.sh") if local else SWEBENCH_RUN_TESTS
            return str(self.row.get("run_tests_path") or default), None
        if local:
            return posixpath.join(w, "run_tests.sh"), posixpath.join(w, self.hidden_tests_dir)
        return posixpath.join(w, "run_tests.sh"), str(self.row.get("r2e_tests_path") or IMAGE_TESTS_DIR)

    async def _capture_hidden(self, sandbox: Sandbox) -> None:
        """Copy run_tests.sh and the hidden tests out of the sandbox, then delete them there."""
        run_tests, tests = self._hidden_sources(sandbox)
        stage = f"/tmp/.uniagent_r2e_{secrets.token_hex(6)}"
        s, rt = quote(stage), quote(run_tests)
        lines = [
            f"rm -rf {s} && mkdir -p {s} || exit 1",
            f"if [ ! -f {rt} ]; then echo no verifier script at {rt}; exit 3; fi",
            f"cp {rt} {s}/run_tests.sh || exit 1",
        ]
        if tests is not None:
            t = quote(tests)
            lines += [
                f"if [ ! -d {t} ]; then echo no hidden tests at {t}; exit 3; fi",
                f"cp -rL {t} {s}/{HIDDEN_TESTS} || exit 1",
            ]
        lines += [
            f"find {s} -name __pycache__ -prune -exec rm -rf {{}} + ; find {s} -name '*.pyc' -delete",
            f"tar -czf {s}.tgz -C {s} . && rm -rf {s} || exit 1",
            f"rm -f {rt}" + (f" && rm -rf {quote(tests)}" if tests else ""),
            f"rm -rf {quote(posixpath.join(sandbox.workdir, HIDDEN_TESTS))}",
        ]
        await repo.run_checked(sandbox, "\n".join(lines), "taking out the hidden tests")
        self._hidden = await sandbox.read_file(f"{stage}.tgz")
        await sandbox.exec(f"rm -f {s}.tgz", session="_setup")

    async def setup(self, sandbox: Sandbox) -> None:
        src = self.repo_path()
        if src is not None:
            await repo.copy_repo(sandbox, src)
        # Before the base commit is made: the hidden files must not end up in its history.
        await self._capture_hidden(sandbox)
        base_commit = self.row.get("base_commit") if src is None and self.mode == "swebench" else None
        self.base = await repo.prepare_base(sandbox, base_commit)
        # The image's environment (an untracked .venv in R2E-Gym images) is neither the agent's
        # work nor something a reset may delete.
        exclude = "\n".join(["", "# uniagent: the task's environment", *ENV_PATHS, ""])
        await repo.run_checked(
            sandbox,
            f'f="$({repo.GIT} rev-parse --git-path info/exclude)" && mkdir -p "$(dirname "$f")" && '
            f'printf %s {quote(exclude)} >> "$f"',
            "ignoring the environment's files",
        )

    def tools(self) -> list[str | dict[str, Any]]:
        return [
            "bash",
            "str_replace_editor",
            {"name": "submit", "base_ref": self.base or "HEAD", "exclude": list(ENV_PATHS)},
        ]

    # -- grading ---------------------------------------------------------------------------
    async def grade_patch(self, sandbox: Sandbox, patch: str) -> Reward:
        """Reset to base, apply `patch` without test or verifier files, restore the hidden
        tests, run run_tests.sh, grade."""
        if self.base is None or self._hidden is None:
            raise SandboxError("grade_patch() needs setup() first")
        agent_patch, dropped = strip_test_changes(patch, self.test_patch)
        kept = []
        for path, chunk in split_patch(agent_patch):
            if path.split("/", 1)[0] in ENV_PATHS:
                dropped.append(path)
            else:
                kept.append(chunk)
        agent_patch = "".join(kept)
        # R2E-Gym images keep build products and the .venv as ignored files: clean only the
        # untracked ones (SweTask's reset also removes ignored files).
        await repo.run_checked(
            sandbox,
            f"{repo.GIT} reset -q --hard {quote(self.base)} && "
            f"{repo.GIT} clean -q -fd " + " ".join(f"-e {quote(p)}" for p in ENV_PATHS),
            "resetting to base",
        )
        ok, out = await repo.apply_patch(sandbox, agent_patch, "model")
        if not ok:
            raise PatchApplyError(f"the patch does not apply to the base commit: {out.strip()[-800:]}")
        refused = await self.guard_tree(sandbox, dropped, ENV_PATHS)
        if refused:
            return self.refuse(refused, dropped, patch)
        log, exit_code, timed_out = await self._run_hidden_tests(sandbox)
        if self.mode == "swebench":
            return self._grade(log, dropped, patch)
        return self._grade_r2e(log, exit_code, timed_out, dropped, patch)

    async def _run_hidden_tests(self, sandbox: Sandbox) -> tuple[str, int | None, bool]:
        assert self._hidden is not None
        stage = f"/tmp/.uniagent_r2e_{secrets.token_hex(6)}"
        s = quote(stage)
        tests_dest = quote(posixpath.join(sandbox.workdir, HIDDEN_TESTS))
        await sandbox.write_file(f"{stage}.tgz", self._hidden)
        await repo.run_checked(
            sandbox,
            "\n".join(
                [
                    f"rm -rf {s} {tests_dest} && mkdir -p {s} || exit 1",
                    f"tar -xzf {s}.tgz -C {s} && rm -f {s}.tgz || exit 1",
                    f"if [ -d {s}/{HIDDEN_TESTS} ]; then cp -r {s}/{HIDDEN_TESTS} {tests_dest} || exit 1; fi",
                ]
            ),
            "putting the hidden tests back",
        )
        res = await sandbox.exec(
            f"bash {s}/run_tests.sh",
            timeout=self.test_timeout_s,
            cwd=sandbox.workdir,
            session="_verify",
            max_output=LOG_LIMIT,
        )
        return _ANSI_CR.sub("", res.output), res.exit_code, res.timed_out

    def _grade_r2e(
        self, log: str, exit_code: int | None, timed_out: bool, dropped: list[str], patch: str
    ) -> Reward:
        from swebench.harness.constants import ResolvedStatus

        parsed = {} if timed_out else parse_r2e_log(log)
        match, diff = compare_r2e(parsed, self.expected)
        failing = any(v in ("FAILED", "ERROR") for v in parsed.values())
        inconsistent = exit_code not in (0, None) and bool(parsed) and not failing
        resolved = match and not inconsistent and not timed_out
        details: dict[str, Any] = {
            "tests_ran": bool(parsed),
            "status_map": parsed,
            "expected": self.expected,
            **diff,
            "exit_code": exit_code,
            "timed_out": timed_out,
            "ignored_test_changes": dropped,
            "patch_bytes": len(patch.encode("utf-8", errors="surrogateescape")),
            "log_tail": log[-4000:],
            "resolution": (ResolvedStatus.FULL if resolved else ResolvedStatus.NO).value,
        }
        if inconsistent:
            details["rejected"] = "the tests exited non-zero but the summary reports no failure"
        return Reward(1.0 if resolved else 0.0, resolved, details)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "image": self.row.get("image"), "grading": self.mode}
