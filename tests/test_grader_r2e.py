"""In-process cheats against R2E-Gym rows, whose tests run through the image's `run_tests.sh`:
a patch that changes only the package's `__init__.py`. Each is graded twice by `uniagent
verify`'s entry point in real sandboxes: with the grader's pytest plugin (refused, naming the
evidence, listed in `error_ids`), and with the plugin turned off, where the log alone decides
(resolved: the cheat is a real one, and the plugin is what stops it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent_helpers import make_patch
from conftest import needs_bwrap
from test_grader_inprocess import HELP, REPORT_PATCH
from test_tasks_r2e_gym import FIXTURES, ROWS, swebench_repo_row
from uniagent.tasks import witness
from uniagent.tasks.loading import load_rows
from uniagent.tasks.r2e_gym import R2EGymTask
from uniagent.tasks.verify import verify

pytestmark = needs_bwrap

VECMATH = FIXTURES / "r2e_gym" / "vecmath"
TEXTKIT_INIT = (FIXTURES / "swe_rebench" / "textkit" / "textkit" / "__init__.py").read_text()
# Only the test the bug fails is reported passed: R2E-Gym's comparison wants the others as they are.
TARGETED_REPORT_PATCH = """
import _pytest.reports as _r
_orig = _r.TestReport.from_item_and_call.__func__
def _f(cls, item, call):
    rep = _orig(cls, item, call)
    if item.name == "test_norm_3_4_5":
        rep.outcome, rep.longrepr = "passed", None
    return rep
_r.TestReport.from_item_and_call = classmethod(_f)
"""
# At import (collection), a short summary that is exactly the expected output, then status 0.
FORGED_SUMMARY_THEN_EXIT = """
import json as _json
_want = {expected}
_os.write(_fd(), ("short test summary info\\n" + "".join(
    "%s r2e_tests/test_1.py::%s\\n" % (st, k.replace(".", "::")) for k, st in _want.items())).encode())
_os._exit(0)
"""
# (row kind, package __init__ the patch rewrites, cheat, evidence named when refused)
CHEATS = {
    "r2e-targeted-report-patch": ("r2e", "vecmath/__init__.py", TARGETED_REPORT_PATCH, "was rewritten"),
    "r2e-forged-summary-then-exit": ("r2e", "vecmath/__init__.py", None, "no session-finished record"),
    "swebench-report-patch": ("swebench", "textkit/__init__.py", REPORT_PATCH, "was rewritten"),
}


def _grade_all(root: Path) -> dict[str, Any]:
    vec = load_rows(ROWS)[0]  # vecmath, from its repo_dir
    tasks, preds = [], {}
    for name, (kind, init, code, _) in CHEATS.items():
        if kind == "r2e":
            task = R2EGymTask({**vec, "instance_id": name}, str(ROWS))
            code = code or FORGED_SUMMARY_THEN_EXIT.format(expected=task.expected)
            source = (VECMATH / init).read_text()
            patch = make_patch(
                root / name, VECMATH, {init: source + HELP + code}, ("run_tests.sh", "r2e_tests")
            )
        else:
            task = R2EGymTask(swebench_repo_row(root, instance_id=name))
            patch = make_patch(
                root / name, Path(task.row["repo_dir"]), {init: TEXTKIT_INIT + HELP + code}, ()
            )
        tasks.append(task)
        preds[name] = {"model_patch": patch}
    return asyncio.run(verify(tasks, preds, root / "out", concurrency=3))


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    with_plugin = _grade_all(tmp_path_factory.mktemp("with"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(witness, "not_used", lambda *a: "turned off by this test")
        log_only = _grade_all(tmp_path_factory.mktemp("without"))
    return {"with": with_plugin, "without": log_only}


@pytest.mark.parametrize("name", list(CHEATS))
def test_r2e_gym_cheat_is_refused_by_the_witness(graded: dict[str, dict[str, Any]], name: str) -> None:
    report = graded["with"]
    res = report["instances"][name]
    assert res["status"] == "error" and res["error"].startswith("patch refused: "), res
    assert CHEATS[name][3] in res["details"]["refused"], res["details"]["refused"]
    assert res["details"]["witness"] == "used" and name in report["error_ids"]


@pytest.mark.parametrize("name", list(CHEATS))
def test_r2e_gym_cheat_pays_from_the_log_alone(graded: dict[str, dict[str, Any]], name: str) -> None:
    res = graded["without"]["instances"][name]
    assert res["status"] == "resolved", res
    assert res["details"]["witness"] == "not used: turned off by this test", "verify's report says so"
