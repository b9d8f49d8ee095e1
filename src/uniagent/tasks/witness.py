"""Grade a pytest run from the grader's own records, not from what the run printed.

A module the tests import runs inside the test process, so it can rewrite pytest's reports,
print PASSED lines, or leave with status 0 before a test runs: a grader that trusts the log
pays all of that as a fix. Where the tests run with pytest (`not_used` says when: one pytest
command, no tox/nox, xdist, PYTHONPATH or PYTEST_PLUGINS of its own, a log read by one of
swebench's pytest parsers or a repository's alias of one), the grader copies `witness_plugin`
into a private directory under /tmp (outside the workspace, random names, a key file the plugin
reads and deletes at import) and has pytest load it. The run is graded from its records, and
refused (`details.refused`, reward 0; `uniagent verify` lists it under `error_ids`) when:

- no records, a broken HMAC chain, a foreign nonce, or a session without its finished record
  (the process left early, the records were deleted or rewritten, the plugin was removed);
- pytest's or pluggy's internals, the hook callers, their implementations (new ones may come
  only from conftest.py), import hooks or trace functions changed during the session;
- a report says more than the call's own exception does (a failed call reported passed), a
  report was logged that no `pytest_runtest_makereport` made, or the same test and phase was
  recorded twice with different outcomes;
- the terminal reporter's counts or the exit status disagree with the records;
- the log reports a test PASSED or XFAIL that the records did not see pass (forged lines, at
  import, from a thread, at exit), or `pytest.xfail()` was called from outside the tests.

Which rows: a SWE row's `test_cmd`; an R2E-Gym row's `run_tests.sh` (its text, read from the
verifier captured at setup, here-documents skipped), in both of its modes. Every graded run's
`details.witness` says "used" or "not used: <why>" (`label`), and `uniagent verify` carries it
in each instance's details, so which rows are graded from the log alone is visible per row.

The status map built from the records has swebench's test ids (pytest's cwd-relative node ids,
as `-rA` prints them), so FAIL_TO_PASS / PASS_TO_PASS are graded by swebench's own functions.
An R2E-Gym row (its own summary parser and comparison) keeps R2E-Gym's verdict on the log, given
only when the records hold and every PASSED line of the summary is a test whose call the records
saw pass (keyed as R2E-Gym keys tests, without the file).

What can still fool the log-only path (no records: `eval_script` rows; the django, sympy,
matplotlib and seaborn parsers and every other non-pytest one (other languages' suites);
tox/nox, xdist or a command that sets PYTHONPATH / PYTEST_PLUGINS; a script that runs pytest
twice; R2E-Gym rows whose run_tests.sh is such a script): a status line the code under test
prints to the pipe the log is read from (at import, from a thread, at exit; the parser keeps a
test's last line, so a forged line after the real one wins); leaving early with status 0 after
printing them; rewriting the runner's own results in-process (pytest's reports, django's or
unittest's TestResult), which then prints real-looking lines. What holds there: only the task's
expected tests count, an expected test the log does not report counts as failed, `guard`'s
static rules, and for R2E-Gym rows that a run exiting non-zero with no failing test is no pass.

What stays possible in principle with the records: code in the test process can do anything the
plugin can. It could read the key from the plugin's memory (or the open records file from /proc)
and write a perfect record set, patch the plugin's checks before they run, or make a test's call
return without raising by editing the test's code object while leaving pytest untouched. These
take a cheat aimed at this grader specifically; a test that runs in a separate process is the
only full answer. On R2E-Gym rows, FAILED / ERROR summary lines are not checked against the
records (forging one could only turn a passing test into an expected failure), and two tests of
the same name in different files share R2E-Gym's key, so a PASSED line for one is backed by the
other passing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uniagent.errors import SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.procs import quote
from uniagent.sandbox.shell import ExecResult

LOG_LIMIT = 4_000_000  # what a test run's log keeps

PYTEST_PARSERS = ("parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2")
_PYTEST = re.compile(r"\bpytest\b")
_OPTS_OUT = re.compile(r"\b(PYTHONPATH|PYTEST_PLUGINS)\b|\s-n\s*\S|--numprocesses|\bxdist\b")
_RUNNERS_OUT = re.compile(r"\b(tox|nox)\b")  # they run pytest in an environment of their own
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
_PLUGIN_SOURCE = Path(__file__).with_name("witness_plugin.py")
PASSING = ("PASSED", "XFAIL")
USED = "used"


@dataclass
class Witness:
    """One run's private directory, module name, key and nonce."""

    directory: str
    module: str
    key: str
    nonce: str
    records: bytes = b""
    exit_code: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# A run's evidence: the grader's records, or why the run has none (graded from its log alone).
Evidence = Witness | str


def label(evidence: Evidence) -> str:
    """`details.witness`: "used", or "not used: <why>"."""
    return USED if isinstance(evidence, Witness) else f"not used: {evidence or 'no pytest run'}"


def is_pytest_parser(log_parser: str) -> bool:
    """One of swebench's pytest parsers, under its own name or a repository's alias of it
    (`parse_log_flask` is `parse_log_pytest`)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    fn = PARSER_REGISTRY.get(log_parser)
    return fn is not None and any(fn is PARSER_REGISTRY.get(n) for n in PYTEST_PARSERS)


def command_lines(script: str) -> list[str]:
    """The lines of a shell script that run something: no comments, no `: '...'` markers, no
    here-document bodies (SWE-bench's eval script carries the test patch in one)."""
    out, end = [], None
    for line in script.splitlines():
        if end is not None:
            end = None if line.strip() == end else end
            continue
        code = line.strip()
        if not code or code.startswith(("#", ": ")):
            continue
        out.append(code)
        m = _HEREDOC.search(code)
        end = m.group(2) if m else None
    return out


def not_used(test_cmd: str | None, eval_script: str | None, log_parser: str) -> str | None:
    """Why the grader's plugin cannot witness a run of `test_cmd` (a command line or a script's
    text), or None when it can: pytest runs once, in this process tree, with the environment the
    plugin is loaded through, and its log is read by a swebench pytest parser."""
    if eval_script:
        return "eval_script row (SWE-bench's eval script runs as written; graded from its log)"
    if not is_pytest_parser(log_parser):
        return f"the {log_parser} log parser is not pytest's (graded from its log)"
    lines = [ln for ln in command_lines(test_cmd or "") if _PYTEST.search(ln)]
    if not lines:
        return "the test command does not run pytest (graded from its log)"
    if len(lines) > 1:
        return "the test command runs pytest more than once (graded from its log)"
    if _OPTS_OUT.search(lines[0]) or _RUNNERS_OUT.search(lines[0]):
        return "the test command sets PYTHONPATH / PYTEST_PLUGINS, or runs pytest through xdist or tox"
    return None


def applies(test_cmd: str | None, eval_script: str | None, log_parser: str) -> bool:
    return not_used(test_cmd, eval_script, log_parser) is None


async def run(
    sandbox: Sandbox,
    command: str,
    log_parser: str,
    *,
    text: str | None = None,
    timeout: float,
) -> tuple[ExecResult, Evidence]:
    """Run the tests (`command`; `text` is what it runs, when that is a script), with the
    plugin where `not_used` allows it. A run cut off by its timeout is graded as a timeout, not
    as tampering: its evidence is the reason."""
    why = not_used(command if text is None else text, None, log_parser)
    w = None if why else await install(sandbox)
    res = await sandbox.exec(
        wrap(command, w) if w else command,
        timeout=timeout,
        cwd=sandbox.workdir,
        session="_verify",
        max_output=LOG_LIMIT,
    )
    if w is not None:
        w = await collect(sandbox, w, res.exit_code)
    if res.timed_out:
        return res, "the test run timed out (graded as a timeout)"
    return res, w if w is not None else str(why)


async def install(sandbox: Sandbox) -> Witness:
    token = secrets.token_hex(8)
    w = Witness(
        f"/tmp/.uniagent_w_{token}",
        f"_uniagent_witness_{token}",
        secrets.token_hex(32),
        secrets.token_hex(16),
    )
    await sandbox.write_file(f"{w.directory}/{w.module}.py", _PLUGIN_SOURCE.read_text())
    await sandbox.write_file(f"{w.directory}/key", f"{w.key} {w.nonce}\n")
    return w


def wrap(command: str, w: Witness) -> str:
    """`command` with the plugin on pytest's list and its directory (only) added to the path."""
    d = quote(w.directory)
    return (
        f"( export PYTHONPATH={d}${{PYTHONPATH:+:$PYTHONPATH}} "
        f"PYTEST_PLUGINS={w.module}${{PYTEST_PLUGINS:+,$PYTEST_PLUGINS}}\n{command}\n)"
    )


async def collect(sandbox: Sandbox, w: Witness, exit_code: int | None) -> Witness:
    try:
        w.records = await sandbox.read_file(f"{w.directory}/records")
    except (OSError, SandboxError):  # no records file: judged by `check`
        w.records = b""
    await sandbox.exec(f"rm -rf {quote(w.directory)}", session="_setup")
    w.exit_code = exit_code
    return w


class Refused(Exception):
    """The run's evidence does not hold; the message names it."""


def _records(w: Witness) -> list[dict[str, Any]]:
    out, prev = [], ""
    for n, line in enumerate(w.records.decode("utf-8", "replace").splitlines(), 1):
        try:
            wrapped = json.loads(line)
            body, mac = wrapped["r"], wrapped["mac"]
        except (ValueError, KeyError, TypeError):
            raise Refused(f"the grader's test records were altered (line {n} is not a record)") from None
        want = hmac.new(w.key.encode(), (prev + body).encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, str(mac)):
            raise Refused(f"the grader's test records were altered or forged (line {n} fails its HMAC)")
        prev = mac
        out.append(json.loads(body))
    return out


def _category(r: dict[str, Any]) -> str:
    """The terminal reporter's category for a record's report (as `pytest_report_teststatus`)."""
    rep, when = r["report"], r["when"]
    if rep == "passed":
        return ("xpassed" if r["wasxfail"] else "passed") if when == "call" else ""
    if rep == "failed":
        return "failed" if when == "call" else "error"
    return "xfailed" if r["wasxfail"] else "skipped"


def _status(r: dict[str, Any]) -> str | None:
    """The swebench status one phase's own evidence gives (None: a phase that passed quietly)."""
    raw, when = r["raw"], r["when"]
    if when != "call":
        return {"failed": "ERROR", "skipped": "SKIPPED"}.get(raw)
    if raw == "passed":
        return "FAILED" if r["report"] == "failed" else ("XPASS" if r["wasxfail"] else "PASSED")
    if raw == "failed":
        return "XFAIL" if r["wasxfail"] and r["report"] == "skipped" else "FAILED"
    return {"xfailed": "XFAIL", "skipped": "SKIPPED"}[raw]


_FAVOUR = {"failed": 0, "skipped": 1, "xfailed": 2, "passed": 3}


def _check_test(r: dict[str, Any], is_test_file: Callable[[str], bool]) -> None:
    nodeid, raw, rep = r["nodeid"], r["raw"], r["report"]
    said = "xfailed" if r["wasxfail"] and rep == "skipped" else rep
    if said == "xfailed" and raw == "failed":
        return  # an xfail-marked test that failed
    if _FAVOUR.get(said, 0) > _FAVOUR[raw] and not (said == "passed" and r["wasxfail"]):
        raise Refused(
            f"{nodeid} ({r['when']}): its report says {rep}, but the call raised {r['exc'] or 'nothing'}"
            f" ({raw}): the report was rewritten"
        )
    where = r.get("raised_in")
    if raw == "xfailed" and where and not is_test_file(where):
        raise Refused(f"{nodeid}: pytest.xfail() was called from {where}, outside the tests")


def check(
    w: Witness, log_map: dict[str, str], is_test_file: Callable[[str], bool], key_of: Callable[[str], str]
) -> dict[str, str]:
    """The status map the records give, or Refused naming the evidence that does not hold.
    `key_of` turns a node id into the log parser's key for it (a parser that splits on spaces
    keeps `test_x[a` of `test_x[a b]`, and the task's test lists are written that way)."""
    records = _records(w)
    if not records:
        if any(s in PASSING for s in log_map.values()):
            raise Refused("the log reports passing tests, but the grader's pytest plugin recorded no session")
        return {}
    status: dict[str, str] = {}
    call_passed: set[str] = set()  # a passing call, whatever its teardown did (-rA prints PASSED)
    seen: dict[tuple[str, str], str] = {}
    session: dict[str, Any] | None = None
    tests: list[dict[str, Any]] = []
    for r in records:
        kind = r.get("kind")
        if kind == "start":
            if session is not None:
                raise Refused("a pytest session started inside another one before it finished")
            if r.get("nonce") != w.nonce:
                raise Refused("a session-start record carries a foreign nonce")
            session, tests = r, []
        elif session is None:
            raise Refused(f"a {kind} record outside any pytest session")
        elif kind == "test":
            key = (r["nodeid"], r["when"])
            if key in seen and seen[key] != r["raw"]:
                raise Refused(f"{r['nodeid']} ({r['when']}) was recorded twice with different outcomes")
            seen[key] = r["raw"]
            _check_test(r, is_test_file)
            tests.append(r)
        elif kind == "unmade":
            raise Refused(f"a report for {r['nodeid']} ({r['report']}) was logged that pytest never made")
        elif kind == "finish":
            _check_finish(r, w.nonce, tests)
            for t in tests:
                s = _status(t)
                key = key_of(t["nodeid"])
                if t["when"] == "call" and s in PASSING:
                    call_passed.add(key)
                if s and not (s == "PASSED" and status.get(key) in ("ERROR", "FAILED")):
                    status[key] = s
            session = None
    if session is not None:
        raise Refused(
            "the test process ended before pytest finished its session (no session-finished record)"
        )
    status = {k: v for k, v in status.items() if v != "XPASS"}  # as the log parser: no XPASS status
    for test, said in log_map.items():
        if said in PASSING and test not in call_passed:
            saw = status.get(test, "no such test")
            raise Refused(f"the log reports {test} {said}, but the grader's plugin saw {saw}")
    return status


def _check_finish(r: dict[str, Any], nonce: str, tests: list[dict[str, Any]]) -> None:
    if r.get("nonce") != nonce:
        raise Refused("the session-finished record carries a foreign nonce")
    if r["changed"]:
        raise Refused("pytest's internals changed during the run: " + ", ".join(r["changed"][:8]))
    counts: dict[str, int] = {}
    for t in tests:
        counts[_category(t)] = counts.get(_category(t), 0) + 1
    for key in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        if r["stats"] is not None and r["stats"].get(key, 0) != counts.get(key, 0):
            raise Refused(
                f"pytest's summary counts {r['stats'].get(key, 0)} {key}, the records {counts.get(key, 0)}"
            )
    bad = sum(1 for t in tests if t["raw"] == "failed" and not t["wasxfail"])
    if r["exitstatus"] == 0 and bad:
        raise Refused(f"pytest's exit status is 0, but {bad} test phases failed")
    if r["exitstatus"] == 1 and not bad and not any(t["report"] == "failed" for t in tests):
        raise Refused("pytest's exit status says tests failed, but no test phase failed")
