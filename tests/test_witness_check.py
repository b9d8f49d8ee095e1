"""The grader-side checks of `uniagent.tasks.witness` on their own: synthetic record sets,
chained as the plugin chains them, fed to `check` (no sandbox, no pytest run). Each kind of
evidence that must not hold is refused with its name; a sound record set grades as it says.
Also which runs get the plugin at all (`not_used`), as `details.witness` reports it."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from uniagent.tasks.witness import Refused, Witness, check, label, not_used

KEY, NONCE = "ab" * 32, "cd" * 16


def chained(records: list[dict[str, Any]], key: str = KEY) -> list[str]:
    """Record lines as the plugin's `_emit` writes them: body, and an HMAC over the previous MAC
    and the body."""
    lines, prev = [], ""
    for r in records:
        body = json.dumps(r, sort_keys=True)
        mac = hmac.new(key.encode(), (prev + body).encode(), hashlib.sha256).hexdigest()
        lines.append(json.dumps({"r": body, "mac": mac}))
        prev = mac
    return lines


def witness_of(lines: list[str]) -> Witness:
    return Witness("/tmp/w", "m", KEY, NONCE, records="".join(ln + "\n" for ln in lines).encode())


def phase(nodeid: str, raw: str = "passed", when: str = "call", **over: Any) -> dict[str, Any]:
    exc = {"passed": None, "failed": "AssertionError", "skipped": "Skipped", "xfailed": "XFailed"}[raw]
    return {"kind": "test", "nodeid": nodeid, "when": when, "raw": raw, "exc": exc, "report": raw,
            "wasxfail": False, **over}  # fmt: skip


def session(tests: list[dict[str, Any]], **finish: Any) -> list[dict[str, Any]]:
    """start, the tests' phases, finish with counts and exit status that agree with them."""
    counts = {"passed": 0, "failed": 0}
    for t in tests:
        if t["when"] == "call":
            counts[t["report"]] = counts.get(t["report"], 0) + 1
    end = {"kind": "finish", "nonce": NONCE, "changed": [], "stats": counts,
           "exitstatus": 1 if counts["failed"] else 0, **finish}  # fmt: skip
    return [{"kind": "start", "nonce": NONCE}, *tests, end]


TESTS = [phase("t.py::a"), phase("t.py::b", "failed"), phase("t.py::b", when="teardown")]


def grade(records: list[Any], log: dict[str, str] | None = None) -> dict[str, str]:
    """`check` on records (chained here) or on record lines as they are."""
    lines = records if records and isinstance(records[0], str) else chained(records)
    return check(witness_of(lines), log or {}, lambda path: "/tests/" in path, lambda nodeid: nodeid)


def refused(records: list[Any], log: dict[str, str] | None = None) -> str:
    with pytest.raises(Refused) as exc:
        grade(records, log)
    return str(exc.value)


def test_a_sound_session_grades_from_its_records() -> None:
    assert grade(session(TESTS), {"t.py::a": "PASSED"}) == {"t.py::a": "PASSED", "t.py::b": "FAILED"}
    assert grade([]) == {}, "no records and no passing line: nothing ran (graded unresolved)"


def test_a_broken_chain() -> None:
    lines = chained(session(TESTS))
    forged = json.loads(lines[2])
    forged["r"] = forged["r"].replace('"failed"', '"passed"')  # b's call, its MAC kept
    assert "line 3 fails its HMAC" in refused([*lines[:2], json.dumps(forged), *lines[3:]])
    assert "line 3 fails its HMAC" in refused([*lines[:2], *lines[3:]]), "a record taken out"
    assert "fails its HMAC" in refused(chained(session(TESTS), key="ef" * 32)), "another key"
    assert "line 2 is not a record" in refused([lines[0], "PASSED t.py::b", *lines[1:]])


def test_a_foreign_nonce() -> None:
    records = session(TESTS)
    start, finish = dict(records[0], nonce="0" * 32), dict(records[-1], nonce="0" * 32)
    assert "session-start record carries a foreign nonce" in refused([start, *records[1:]])
    assert "session-finished record carries a foreign nonce" in refused([*records[:-1], finish])


def test_a_session_without_its_finished_record() -> None:
    assert "no session-finished record" in refused(session(TESTS)[:-1])
    assert "no session-finished record" in refused(session(TESTS)[:1]), "left at collection"
    assert "inside another one" in refused([session(TESTS)[0], *session(TESTS)])
    assert "outside any pytest session" in refused([phase("t.py::a"), *session(TESTS)])


def test_a_test_recorded_twice_with_different_outcomes() -> None:
    twice = [phase("t.py::b", "failed"), phase("t.py::b")]
    assert "t.py::b (call) was recorded twice with different outcomes" in refused(session(twice))
    same = [phase("t.py::a"), phase("t.py::a")]
    assert grade(session(same)) == {"t.py::a": "PASSED"}, "a rerun with the same outcome is no conflict"


def test_counts_and_exit_status_inconsistent_with_the_records() -> None:
    more = session(TESTS, stats={"passed": 2, "failed": 1})
    assert "pytest's summary counts 2 passed, the records 1" in refused(more)
    fewer = session(TESTS, stats={"passed": 1, "failed": 0})
    assert "counts 0 failed, the records 1" in refused(fewer)
    assert "exit status is 0, but 1 test phases failed" in refused(session(TESTS, exitstatus=0))
    passing = [phase("t.py::a")]
    assert "says tests failed, but no test phase failed" in refused(session(passing, exitstatus=1))
    assert grade(session(TESTS, stats=None)) == {"t.py::a": "PASSED", "t.py::b": "FAILED"}, "-p no:terminal"


def test_a_passed_line_in_the_log_with_no_record_behind_it() -> None:
    msg = refused(session(TESTS), {"t.py::a": "PASSED", "t.py::c": "PASSED"})
    assert msg == "the log reports t.py::c PASSED, but the grader's plugin saw no such test"
    assert "the grader's plugin saw FAILED" in refused(session(TESTS), {"t.py::b": "PASSED"})
    assert "saw FAILED" in refused(session(TESTS), {"t.py::b": "XFAIL"})
    assert "recorded no session" in refused([], {"t.py::a": "PASSED"}), "the plugin never loaded"
    assert grade(session(TESTS), {"t.py::b": "FAILED"}), "only passing claims need a record"


def test_reports_the_call_does_not_back() -> None:
    rewritten = [phase("t.py::b", "failed", report="passed")]
    msg = refused(session(rewritten, stats={"passed": 1, "failed": 0}, exitstatus=1))
    assert "t.py::b (call): its report says passed, but the call raised AssertionError" in msg
    unmade = {"kind": "unmade", "nodeid": "t.py::b", "report": "passed"}
    assert "pytest never made" in refused([*session(TESTS)[:-1], unmade, session(TESTS)[-1]])
    assert "internals changed during the run: _pytest.runner.call_and_report" in refused(
        session(TESTS, changed=["_pytest.runner.call_and_report"])
    )
    xfail = phase("t.py::a", "xfailed", report="skipped", wasxfail=True, raised_in="/w/pkg/__init__.py")
    assert "pytest.xfail() was called from /w/pkg/__init__.py" in refused(session([xfail], stats=None))
    honest = dict(xfail, raised_in="/w/tests/test_x.py")
    assert grade(session([honest], stats=None)) == {"t.py::a": "XFAIL"}


@pytest.mark.parametrize(
    ("cmd", "eval_script", "parser", "why"),
    [
        ("pytest -rA tests", None, "parse_log_pytest", None),
        ("pytest -rA tests", None, "parse_log_flask", None),  # swebench's alias of parse_log_pytest
        ("pytest -rA tests", "bash eval.sh", "parse_log_pytest", "eval_script row"),
        ("./tests/runtests.py auth", None, "parse_log_django", "parse_log_django log parser is not"),
        ("bin/test sympy", None, "parse_log_pytest", "does not run pytest"),
        ("pytest a\npytest b", None, "parse_log_pytest", "more than once"),
        ("PYTHONPATH=src pytest -rA", None, "parse_log_pytest", "PYTHONPATH"),
        ("pytest -n 4 tests", None, "parse_log_pytest", "xdist"),
        ("tox -epy39 -- tests", None, "parse_log_pytest", "does not run pytest"),
        ("tox --current-env -- pytest tests", None, "parse_log_pytest", "tox"),
        # SWE-bench's eval script shape: the test patch's text (here-document) is not a command.
        (
            "git apply - <<'EOF_1'\n+import pytest\n+PYTHONPATH\nEOF_1\n: '>>>>> Start Test Output'\n"
            "# pytest is run below\npytest -rA tests/test_x.py\n",
            None,
            "parse_log_pytest",
            None,
        ),
    ],
)
def test_which_runs_get_the_plugin(cmd: str, eval_script: str | None, parser: str, why: str | None) -> None:
    reason = not_used(cmd, eval_script, parser)
    if why is None:
        assert reason is None
    else:
        assert reason is not None and why in reason, reason
        assert label(reason).startswith("not used: ") and why in label(reason)
    assert label(Witness("/tmp/w", "m", KEY, NONCE)) == "used"
