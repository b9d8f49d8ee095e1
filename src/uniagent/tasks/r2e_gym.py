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
(an agent's code can print summary lines of its own). Where run_tests.sh runs pytest once (its
text decides: `witness.not_used`), the grader's pytest plugin watches the run: R2E-Gym's verdict
stands only when its records hold and back every PASSED line (`uniagent.tasks.witness`).

Rows whose image is a SWE-bench image ("swebench" in its name: R2E-Gym/SWE-Bench-Verified) are
graded as R2E-Gym grades them: `/run_tests.sh` (the SWE-bench eval script) is run and its log
graded with the swebench parser for the repository against FAIL_TO_PASS / PASS_TO_PASS (from
the plugin's records where the script runs pytest once and the parser is pytest's).

A row may name a local `repo_dir` instead of an image: a directory holding the repository,
`run_tests.sh`, and the hidden tests in the directory the row's `r2e_tests_dir` names
(default `r2e_tests`; a SWE-bench-style row has none, its run_tests.sh applies its test patch);
it runs in the local sandbox.
"""

from __future__ import annotations

import io
import posixpath
import re
import secrets
import tarfile
from typing import Any

from uniagent.agent.result import Reward
from uniagent.errors import ConfigError, SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.procs import quote
from uniagent.sandbox.shell import ExecResult
from uniagent.tasks import repo, witness
from uniagent.tasks.loading import json_field, json_list
from uniagent.tasks.r2e_commit import commit_patch
from uniagent.tasks.swe import PatchApplyError, SweTask, split_patch, strip_test_changes

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
def summary_statuses(log: str) -> list[tuple[str, str]]:
    """(key, status) of each status line of pytest's short summary, in order, as R2E-Gym reads
    them: only the text after the first "short test summary info" (up to a second one) counts; a
    line is PASSED, FAILED or ERROR by the first of those words it contains; the key is the node
    id without its file (`r2e_tests/test_1.py::TestA::test_b` -> `TestA.test_b`), and for
    failures and errors without pytest's " - reason" tail."""
    _, found, rest = log.partition(SUMMARY)
    if not found:
        return []
    out = []
    for line in rest.split(SUMMARY, 1)[0].strip().split("\n"):
        status = next((s for s in ("PASSED", "FAILED", "ERROR") if s in line), None)
        if status is not None:
            name = r2e_key(line)
            out.append((name if status == "PASSED" else name.split(" - ")[0], status))
    return out


def r2e_key(nodeid: str) -> str:
    return ".".join(nodeid.split("::")[1:])


def parse_r2e_log(log: str) -> dict[str, str]:
    """Test statuses from pytest's short summary, keyed the way R2E-Gym keys them (a test's
    last line decides)."""
    return dict(summary_statuses(log))


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


def _json_obj(value: Any, field: str) -> dict[str, Any]:
    value = json_field(value, field)
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
        self._run_tests_text = ""  # what run_tests.sh runs: whether the witness can see it

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
        with tarfile.open(fileobj=io.BytesIO(self._hidden), mode="r:gz") as tar:
            fh = tar.extractfile("./run_tests.sh")
            self._run_tests_text = fh.read().decode("utf-8", "replace") if fh else ""

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
        log, res, evidence = await self._run_hidden_tests(sandbox)
        if self.mode == "swebench":
            return self._grade(log, dropped, patch, evidence, sandbox.workdir)
        return self._grade_r2e(log, res.exit_code, res.timed_out, dropped, patch, evidence, sandbox.workdir)

    async def _run_hidden_tests(self, sandbox: Sandbox) -> tuple[str, ExecResult, witness.Evidence]:
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
        res, evidence = await witness.run(
            sandbox,
            f"bash {s}/run_tests.sh",
            self.log_parser,
            text=self._run_tests_text,
            timeout=self.test_timeout_s,
        )
        return _ANSI_CR.sub("", res.output), res, evidence

    def _grade_r2e(
        self,
        log: str,
        exit_code: int | None,
        timed_out: bool,
        dropped: list[str],
        patch: str,
        evidence: witness.Evidence = "",
        workdir: str = WORKDIR,
    ) -> Reward:
        """R2E-Gym's verdict on the log; with the grader's records, only once every PASSED line of
        the summary is a test whose call the records saw pass, and the records hold."""
        from swebench.harness.constants import ResolvedStatus

        refused = self._witness_refusal(log, evidence, workdir)

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
            "witness": witness.label(evidence),
            "resolution": (ResolvedStatus.FULL if resolved else ResolvedStatus.NO).value,
        }
        if refused:
            details.update(refused=refused, resolution=ResolvedStatus.NO.value)
            return Reward(0.0, False, details)
        if inconsistent:
            details["rejected"] = "the tests exited non-zero but the summary reports no failure"
        return Reward(1.0 if resolved else 0.0, resolved, details)

    def _witness_refusal(self, log: str, evidence: witness.Evidence, workdir: str) -> str | None:
        if not isinstance(evidence, witness.Witness):
            return None
        claimed = {k: st for k, st in summary_statuses(log) if st == "PASSED"}
        is_test = self.is_test_file(workdir)
        hidden = posixpath.join(workdir, HIDDEN_TESTS) + "/"
        try:
            witness.check(evidence, claimed, lambda p: p.startswith(hidden) or is_test(p), r2e_key)
        except witness.Refused as exc:
            return str(exc)
        return None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "image": self.row.get("image"), "grading": self.mode}
