"""SWE-bench-style tasks: fix a repository so that the hidden tests pass.

Grading never trusts the workspace as the agent left it. The agent's work is taken as a
patch against the base commit, the repository is reset, the patch is re-applied without
its changes to test files and test configuration (conftest.py, pytest.ini, ...), the task's
test patch is applied, the tests run, and the log is graded with the `swebench` package's
own parser and grading functions. Editing the tests cannot turn a wrong fix into a pass, and
a patch that changes how the tests are collected, run or reported is refused (`guard`).
"""

from __future__ import annotations

import posixpath
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniagent.agent.result import EpisodeResult, Reward
from uniagent.errors import ConfigError, SandboxDeadError, SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import SandboxConfig, image_config, parse_config
from uniagent.tasks import guard, repo, witness, workspace
from uniagent.tasks.base import SYSTEM_PROMPT, Task, WorkspaceDestroyedError
from uniagent.tasks.loading import json_list
from uniagent.tasks.witness import LOG_LIMIT
from uniagent.tools.submit import workspace_patch

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.M)

USER_PROMPT = """<issue>
{problem}
</issue>

The repository is in {workdir}, your working directory. Fix the issue by changing the
source code (not the tests: they are replaced when your work is graded). You can run
commands with `bash` and edit files with `str_replace_editor`.{test_hint}
When the fix is done, call `submit`."""


class PatchApplyError(SandboxError):
    """A prediction's patch does not apply to the task's base commit."""


def patch_files(patch: str) -> list[str]:
    return [m.group(2) for m in _DIFF_HEADER.finditer(patch or "")]


def split_patch(patch: str) -> list[tuple[str, str]]:
    """(path, chunk) per file of a git diff."""
    starts = [m.start() for m in _DIFF_HEADER.finditer(patch)]
    if not starts:
        return []
    chunks = [patch[a:b] for a, b in zip(starts, [*starts[1:], len(patch)], strict=True)]
    return [(patch_files(c)[0], c) for c in chunks]


def is_test_path(path: str, extra: set[str]) -> bool:
    if path in extra:
        return True
    name = posixpath.basename(path)
    parts = path.split("/")[:-1]
    return (
        guard.stripped_path(path)
        or name.startswith("test_")
        or name.endswith("_test.py")
        or any(p in ("tests", "test", "testing") for p in parts)
    )


def strip_test_changes(patch: str, test_patch: str) -> tuple[str, list[str]]:
    """The agent's patch without changes to test files; also which files were dropped."""
    protected = set(patch_files(test_patch))
    kept, dropped = [], []
    for path, chunk in split_patch(patch):
        (dropped if is_test_path(path, protected) else kept).append((path, chunk))
    return "".join(c for _, c in kept), [p for p, _ in dropped]


def parser_name(name: str | None) -> str:
    from swebench.harness.log_parsers import PARSER_REGISTRY

    name = name or "pytest"
    for candidate in (name, f"parse_log_{name}"):
        if candidate in PARSER_REGISTRY:
            return candidate
    known = ", ".join(sorted(k.removeprefix("parse_log_") for k in PARSER_REGISTRY)[:20])
    raise ConfigError(f"log_parser {name!r} is not in the swebench parser registry (some: {known}, ...)")


class SweTask(Task):
    family = "swe"
    carries = "patch"
    patch_exclude: tuple[str, ...] = ()
    """Paths of the workspace that are the task's environment, not the agent's work."""

    def __init__(self, row: dict[str, Any], source: str | None = None) -> None:
        super().__init__(row, source)
        missing = [k for k in ("instance_id", "problem_statement") if not row.get(k)]
        if missing:
            raise ConfigError(f"swe task row is missing {', '.join(missing)}")
        if not row.get("image") and not row.get("repo_dir"):
            raise ConfigError(f"{self.instance_id}: a swe row needs `image` or `repo_dir` (its environment)")
        self.fail_to_pass = json_list(row.get("FAIL_TO_PASS"), "FAIL_TO_PASS")
        self.pass_to_pass = json_list(row.get("PASS_TO_PASS"), "PASS_TO_PASS")
        self.test_patch: str = row.get("test_patch") or ""
        self.gold_patch: str = row.get("patch") or ""
        self.log_parser = parser_name(row.get("log_parser"))
        self.test_cmd: str | None = row.get("test_cmd")
        self.eval_script: str | None = row.get("eval_script")
        if not self.test_cmd and not self.eval_script:
            raise ConfigError(
                f"{self.instance_id}: a swe row needs `test_cmd` (or SWE-bench's `eval_script`)"
            )
        self.base: str | None = None
        self.show_test_cmd = bool(row.get("show_test_cmd", False))
        if row.get("repo_dir") and row.get("base_commit"):
            repo.check_base_commit(self.repo_path(), str(row["base_commit"]), self.instance_id)

    # -- environment ---------------------------------------------------------------------
    def sandbox_config(self, base: SandboxConfig | None) -> SandboxConfig:
        """A row with an image runs in it, with the user's settings (limits, env, network,
        timeouts, runtime) kept; the image and its project directory come from the row."""
        image = self.row.get("image")
        if not image:
            return parse_config(base)
        try:
            return image_config(base, str(image), str(self.row.get("workdir") or "/testbed"))
        except ConfigError as exc:
            raise ConfigError(f"{self.instance_id}: {exc}") from None

    def repo_path(self) -> Path | None:
        rd = self.row.get("repo_dir")
        if not rd:
            return None
        p = Path(rd)
        if not p.is_absolute() and self.source:
            p = Path(self.source).parent / p
        if not p.exists():
            raise ConfigError(f"{self.instance_id}: repo_dir {p} does not exist")
        return p

    async def setup(self, sandbox: Sandbox) -> None:
        src = self.repo_path()
        base_commit = self.row.get("base_commit")

        async def prepare() -> str:
            if src is not None:
                await repo.copy_repo(sandbox, src)
            return await repo.prepare_base(sandbox, base_commit, self.instance_id)

        if src is not None and workspace.enabled():  # prepared once per process, then copied
            self.base = await workspace.shared().materialize(sandbox, src, base_commit, prepare)
        else:
            self.base = await prepare()

    # -- the agent's view ----------------------------------------------------------------
    def messages(self) -> list[dict[str, Any]]:
        hint = ""
        if self.show_test_cmd and self.test_cmd:
            hint = f"\nThe project's tests run with: {self.test_cmd}"
        text = USER_PROMPT.format(
            problem=self.row["problem_statement"].strip(), workdir="the current directory", test_hint=hint
        )
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]

    def tools(self) -> list[str | dict[str, Any]]:
        return ["bash", "str_replace_editor", {"name": "submit", "base_ref": self.base or "HEAD"}]

    # -- grading -------------------------------------------------------------------------
    async def final_state(self, sandbox: Sandbox, result: EpisodeResult) -> None:
        """The agent's work as a patch against the base commit, taken from its sandbox; a
        repository whose base commit is gone (the agent removed `.git`, or the tree) is
        `WorkspaceDestroyedError`."""
        assert self.base is not None, "setup() runs before final_state()"
        try:
            result.patch = await workspace_patch(
                sandbox, self.base, sandbox.workdir, list(self.patch_exclude)
            )
        except SandboxDeadError:
            raise
        except SandboxError as exc:
            if not await self._base_intact(sandbox):
                raise WorkspaceDestroyedError(
                    f"the workspace's repository no longer has the base commit {self.base[:12]}: {exc}"
                ) from exc
            raise

    async def _base_intact(self, sandbox: Sandbox) -> bool:
        """Whether the workspace still holds the base commit: git itself says it is not there (1)
        or that there is no repository (128); the check failing otherwise (a sandbox out of
        processes, a timeout) is no evidence either way: True."""
        assert self.base is not None
        try:
            res = await sandbox.exec(
                f"{repo.GIT} rev-parse -q --verify {self.base}^{{commit}}",
                timeout=60,
                cwd=sandbox.workdir,
                session="_tools",
            )
        except SandboxError:
            return True
        return res.timed_out or res.exit_code not in (1, 128)

    async def score(self, sandbox: Sandbox | None, result: EpisodeResult) -> Reward:
        """`grade_patch` of the patch `final_state` carried over."""
        if sandbox is None:
            raise SandboxError(f"{self.family} tasks are graded in a sandbox")
        return await self.grade_patch(sandbox, result.patch or "")

    async def grade_patch(self, sandbox: Sandbox, patch: str) -> Reward:
        """Reset to base, apply `patch` without its test changes, run the tests, grade."""
        if self.base is None:
            raise SandboxError("grade_patch() needs setup() first")
        agent_patch, dropped = strip_test_changes(patch, self.test_patch)
        await repo.reset_to_base(sandbox, self.base)
        ok, out = await repo.apply_patch(sandbox, agent_patch, "model")
        if not ok:
            raise PatchApplyError(f"the patch does not apply to the base commit: {out.strip()[-800:]}")
        refused = await self.guard_tree(sandbox, dropped)
        if refused:
            return self.refuse(refused, dropped, patch)
        log, evidence = await self._run_tests(sandbox)
        return self._grade(log, dropped, patch, evidence, sandbox.workdir)

    async def guard_tree(
        self, sandbox: Sandbox, dropped: list[str], exclude: tuple[str, ...] = ()
    ) -> str | None:
        """Enforce the rules of `uniagent.tasks.guard` on the tree as the patch left it (not on
        the patch's text, which a crafted diff can make lie): test files and test configuration
        go back to base (added to `dropped`); the reason to refuse the patch, or None."""
        assert self.base is not None
        changed, new = await guard.changed_files(sandbox, self.base, exclude)
        protected = set(patch_files(self.test_patch))
        back = [p for p in changed if is_test_path(p, protected)]
        await guard.restore(sandbox, self.base, back, new)
        dropped.extend(p for p in back if p not in dropped)
        return await guard.screen(sandbox, self.base, [p for p in changed if p not in back], new - set(back))

    def refuse(self, reason: str, dropped: list[str], patch: str) -> Reward:
        """A patch that changes how the tests run is not graded: unresolved, with the reason."""
        from swebench.harness.constants import ResolvedStatus

        details = {
            "refused": reason,
            "tests_ran": False,
            "ignored_test_changes": dropped,
            "patch_bytes": len(patch.encode("utf-8", errors="surrogateescape")),
            "resolution": ResolvedStatus.NO.value,
            "witness": witness.label("the tests did not run (the patch was refused)"),
        }
        return Reward(0.0, False, details)

    async def _run_tests(self, sandbox: Sandbox) -> tuple[str, witness.Evidence]:
        """The test log, and the grader's own records where the tests run with pytest (or
        why there are none: `witness.label`)."""
        from swebench.harness.constants import (
            END_TEST_OUTPUT,
            START_TEST_OUTPUT,
            TEST_EXIT_CODE,
            TESTS_TIMEOUT,
        )

        if self.eval_script:
            await sandbox.write_file("/tmp/.uniagent_eval.sh", self.eval_script)
            res = await sandbox.exec(
                "bash /tmp/.uniagent_eval.sh", timeout=1800, session="_verify", max_output=LOG_LIMIT
            )
            return (
                res.output + f"\n{TEST_EXIT_CODE}: {res.exit_code}\n"
                if TEST_EXIT_CODE not in res.output
                else res.output
            ), witness.not_used(self.test_cmd, self.eval_script, self.log_parser) or ""
        ok, out = await repo.apply_patch(sandbox, self.test_patch, "tests")
        if not ok:
            raise SandboxError(f"the task's own test patch does not apply: {out.strip()[-800:]}")
        cmd = self.test_cmd or ""
        res, evidence = await witness.run(sandbox, cmd, self.log_parser, timeout=1800)
        if res.timed_out:
            return f"{START_TEST_OUTPUT}\n{res.output}\n{TESTS_TIMEOUT}\n", evidence
        log = f"{START_TEST_OUTPUT}\n{res.output}\n{END_TEST_OUTPUT}\n{TEST_EXIT_CODE}: {res.exit_code}\n"
        return log, evidence

    def is_test_file(self, workdir: str) -> Callable[[str], bool]:
        """Whether an absolute path in the sandbox is one of the task's test files (where a
        `pytest.xfail()` may come from)."""
        protected = set(patch_files(self.test_patch))

        def rule(path: str) -> bool:
            rel = posixpath.relpath(path, workdir) if workdir else path
            return not rel.startswith("..") and is_test_path(rel, protected)

        return rule

    def _grade(
        self,
        log: str,
        dropped: list[str],
        patch: str,
        evidence: witness.Evidence = "",
        workdir: str = "",
    ) -> Reward:
        """Grade the log with swebench's parser, or, with the grader's pytest records
        (`evidence`), from the records, cross-checked against the log (`uniagent.tasks.witness`).
        `details.witness` says which."""
        from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus
        from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.types import TestSpec

        spec = TestSpec(
            instance_id=self.instance_id,
            image=str(self.row.get("image") or ""),
            eval_script_list=[],
            repo=str(self.row.get("repo") or ""),
            version=str(self.row.get("version") or ""),
            FAIL_TO_PASS=self.fail_to_pass,
            PASS_TO_PASS=self.pass_to_pass,
            log_parser=self.log_parser,
            eval_type=str(self.row.get("eval_type") or "pass_and_fail"),
        )
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=True) as fh:
            fh.write(log)
            fh.flush()
            status_map, ran = get_logs_eval(spec, fh.name)
        details: dict[str, Any] = {
            "tests_ran": ran,
            # Expected tests the log does not report count as failed (a run that skips or
            # hides tests cannot pass by it); listed so a tampered run is visible.
            "missing_tests": [t for t in [*self.fail_to_pass, *self.pass_to_pass] if t not in status_map],
            "ignored_test_changes": dropped,
            "patch_bytes": len(patch.encode("utf-8", errors="surrogateescape")),
            "log_tail": log[-4000:],
            "witness": witness.label(evidence),
        }
        if isinstance(evidence, witness.Witness):
            # Every passing status line the log holds, read line by line (the parser keeps a
            # test's last line only, and swebench drops a log its exit status contradicts):
            # each must match a passing record.
            parse = PARSER_REGISTRY[self.log_parser]
            claimed = {
                t: st
                for line in log.splitlines()
                if "PASSED" in line or "XFAIL" in line
                for t, st in parse(line, spec).items()
                if st in witness.PASSING
            }

            def key_of(nodeid: str) -> str:
                return next(iter(parse(f"PASSED {nodeid}", spec)), nodeid)

            try:
                status_map = witness.check(evidence, claimed, self.is_test_file(workdir), key_of)
            except witness.Refused as exc:
                details.update(refused=str(exc), resolution=ResolvedStatus.NO.value)
                return Reward(0.0, False, details)
            ran = bool(status_map)
            details.update(
                tests_ran=ran,
                graded_from="the grader's pytest plugin",
                missing_tests=[t for t in [*self.fail_to_pass, *self.pass_to_pass] if t not in status_map],
            )
        if not ran:
            details["resolution"] = ResolvedStatus.NO.value
            return Reward(0.0, False, details)
        report = get_eval_tests_report(
            status_map, {FAIL_TO_PASS: self.fail_to_pass, PASS_TO_PASS: self.pass_to_pass}
        )
        resolution = get_resolution_status(report)
        details.update({"status_map": status_map, "report": report, "resolution": resolution})
        resolved = resolution == ResolvedStatus.FULL.value
        return Reward(1.0 if resolved else 0.0, resolved, details)
