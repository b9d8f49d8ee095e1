"""The grader's own pytest plugin: it runs inside the sandbox, under the task's Python.

`uniagent.tasks.witness` copies this file into a private directory outside the workspace under
a random module name, next to a key file, and has pytest load it (`PYTEST_PLUGINS`). It records
what happened to every test from evidence of its own, not from the report objects the code
under test could rewrite: the exception the test's call raised (a hook wrapper around
`pytest_runtest_call`, and `call.excinfo` after the report is made), beside the report's outcome.
At session start it takes a snapshot of pytest's and pluggy's internals (functions and their
code objects, the hook callers, the registered hook implementations, import hooks, trace
functions); at session finish it compares them and writes the counts pytest's terminal reporter
and session kept and the exit status. Every record is a JSON line chained by an HMAC whose key
was read from the key file and deleted at import, so a record the code under test adds, removes
or rewrites breaks the chain, and a process that leaves early has no session-finished record.

It must run anywhere SWE-bench images run tests: the standard library and pytest only, nothing
of uniagent, no type annotations and nothing newer than Python 3.6 or older than pytest 5 /
pluggy 0.13 (what cannot be found in an old version is left out of the snapshot).
"""

import hashlib
import hmac
import importlib
import json
import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
# What the snapshot holds: dotted paths of module attributes and class attributes (read from
# the class's __dict__, so a property or a classmethod is compared as itself).
WATCHED = (
    "_pytest.reports.TestReport.from_item_and_call",
    "_pytest.reports.TestReport.__init__",
    "_pytest.reports.BaseReport.passed",
    "_pytest.reports.BaseReport.failed",
    "_pytest.reports.BaseReport.skipped",
    "_pytest.runner.call_and_report",
    "_pytest.runner.runtestprotocol",
    "_pytest.runner.call_runtest_hook",
    "_pytest.runner.CallInfo.from_call",
    "_pytest.runner.pytest_runtest_makereport",
    "_pytest.runner.pytest_runtest_protocol",
    "_pytest.runner.pytest_runtest_call",
    "_pytest.runner.check_interactive_exception",
    "_pytest.python.pytest_pyfunc_call",
    "_pytest.python.Function.runtest",
    "_pytest.skipping.pytest_runtest_makereport",
    "_pytest.skipping.pytest_runtest_setup",
    "_pytest.skipping.pytest_runtest_call",
    "_pytest.skipping.evaluate_xfail_marks",
    "_pytest.skipping.evaluate_skip_marks",
    "_pytest.skipping.pytest_report_teststatus",
    "_pytest.unittest.TestCaseFunction.runtest",
    "_pytest.unittest.TestCaseFunction.addFailure",
    "_pytest.unittest.TestCaseFunction.addError",
    "_pytest.unittest.TestCaseFunction.addSuccess",
    "_pytest.unittest.pytest_runtest_makereport",
    "_pytest.terminal.TerminalReporter.pytest_runtest_logreport",
    "_pytest.terminal.TerminalReporter.short_test_summary",
    "_pytest.terminal.TerminalReporter.summary_stats",
    "_pytest.terminal.TerminalReporter.write_line",
    "_pytest.terminal.TerminalReporter.write",
    "_pytest.terminal.pytest_report_teststatus",
    "_pytest.terminal._get_line_with_reprcrash_message",
    "_pytest.terminal.build_summary_stats_line",
    "_pytest.main.pytest_runtestloop",
    "_pytest.main.wrap_session",
    "_pytest.main.Session.perform_collect",
    "_pytest.outcomes.skip",
    "_pytest.outcomes.fail",
    "_pytest.outcomes.xfail",
    "_pytest.outcomes.exit",
    "unittest.case.TestCase.run",
    "unittest.result.TestResult.addFailure",
    "unittest.result.TestResult.addError",
    "pluggy._callers._multicall",
    "pluggy.callers._multicall",
    "pluggy._hooks.HookCaller.__call__",
    "pluggy._hooks._HookCaller.__call__",
    "pluggy.hooks._HookCaller.__call__",
    "pluggy._manager.PluginManager._hookexec",
    "pluggy.manager.PluginManager._hookexec",
    "pluggy._result.Result.get_result",
    "pluggy._result._Result.get_result",
    "pluggy.callers._Result.get_result",
    "builtins.__import__",
    "builtins.compile",
    "builtins.exec",
    "os._exit",
    "sys.exit",
)
# The hooks whose callers and implementations are compared (new ones may come only from conftest).
HOOKS = (
    "pytest_runtest_protocol",
    "pytest_runtest_setup",
    "pytest_runtest_call",
    "pytest_runtest_teardown",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_report_teststatus",
    "pytest_pyfunc_call",
    "pytest_runtestloop",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "pytest_collection_modifyitems",
)


def _take_key():
    path = os.path.join(_HERE, "key")
    try:
        with open(path) as fh:
            key, nonce = fh.read().split()
        os.unlink(path)
    except (OSError, ValueError):  # a nested run (subprocess, xdist worker): not the grader's
        return None, None
    return key.encode(), nonce


_KEY, _NONCE = _take_key()
_OUT = open(os.path.join(_HERE, "records"), "ab", buffering=0) if _KEY else None  # noqa: SIM115
_state = {"config": None, "mac": "", "seq": 0, "snapshot": None, "made": set(), "raised": {}}


def _emit(record):
    if _OUT is None:
        return
    body = json.dumps(record, sort_keys=True, default=str)
    mac = hmac.new(_KEY, (_state["mac"] + body).encode(), hashlib.sha256).hexdigest()
    _state["mac"] = mac
    _state["seq"] += 1
    _OUT.write((json.dumps({"r": body, "mac": mac}) + "\n").encode())


def _resolve(dotted):
    """The object at `dotted` (class attributes taken raw from __dict__), or a marker."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        for name in parts[cut:]:
            d = getattr(obj, "__dict__", {})
            obj = d[name] if isinstance(obj, type) and name in d else getattr(obj, name, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


_MISSING = object()


def _code(obj):
    for attr in ("__func__", "fget"):
        obj = getattr(obj, attr, obj) or obj
    return getattr(obj, "__code__", None)


def _snapshot(config):
    pm = config.pluginmanager
    snap = {}
    for dotted in WATCHED:
        obj = _resolve(dotted)
        if obj is not _MISSING:
            snap[dotted] = (obj, _code(obj))
    snap["pluginmanager._inner_hookexec"] = (getattr(pm, "_inner_hookexec", None), None)
    snap["pluginmanager.hook"] = (pm.hook, None)
    for name in HOOKS:
        caller = getattr(pm.hook, name, None)
        snap["hook." + name] = (caller, getattr(caller, "_hookexec", None))
    snap["sys.meta_path"] = (tuple(sys.meta_path), None)
    snap["sys.path_hooks"] = (tuple(sys.path_hooks), None)
    snap["sys.gettrace"] = (sys.gettrace(), None)
    snap["sys.getprofile"] = (sys.getprofile(), None)
    for fn in (pytest_runtest_makereport, pytest_runtest_call, pytest_runtest_logreport, _emit, _verdict):
        snap["witness." + fn.__name__] = (fn, fn.__code__)
    return snap


def _impls(config):
    found = {}
    for name in HOOKS:
        caller = getattr(config.pluginmanager.hook, name, None)
        found[name] = [(i.plugin, i.function) for i in (caller.get_hookimpls() if caller else [])]
    return found


def _changed(config):
    """What differs from the snapshot taken at session start (names of the evidence)."""
    before, impls_before = _state["snapshot"]
    now = _snapshot(config)
    changed = []
    for key, (obj, code) in before.items():
        cur = now.get(key, (_MISSING, None))
        same = cur[0] == obj if key.startswith("sys.") else cur[0] is obj
        if not same or cur[1] is not code:
            changed.append(key)
    for name, impls in _impls(config).items():
        for plugin, fn in impls:
            is_conftest = os.path.basename(getattr(plugin, "__file__", "") or "") == "conftest.py"
            if (plugin, fn) not in impls_before[name] and not is_conftest:
                changed.append(
                    "a new " + name + " implementation (" + str(getattr(fn, "__module__", "?")) + ")"
                )
    return changed


def _mine(config):
    return config is not None and config is _state["config"]


def _where(excinfo):
    """The file outside pytest that raised the exception (who called pytest.xfail/skip)."""
    tb, found = excinfo.tb if excinfo is not None else None, None
    pytest_dir = os.path.dirname(os.path.dirname(os.path.abspath(pytest.__file__)))
    while tb is not None:
        name = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not name.startswith(os.path.join(pytest_dir, "_pytest")) and "pluggy" not in name:
            found = name
        tb = tb.tb_next
    return found


def _verdict(exc):
    """What the raised exception means, from its type alone: passed / skipped / xfailed / failed."""
    if exc is None:
        return "passed"
    unittest = sys.modules.get("unittest")
    if isinstance(exc, pytest.skip.Exception) or (unittest and isinstance(exc, unittest.SkipTest)):
        return "skipped"
    if isinstance(exc, pytest.xfail.Exception):
        return "xfailed"
    return "failed"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if _state["config"] is None and _KEY:
        _state["config"] = config


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    if not _mine(session.config):
        return
    _state["snapshot"] = (_snapshot(session.config), _impls(session.config))
    _emit({"kind": "start", "nonce": _NONCE, "pytest": pytest.__version__, "pid": os.getpid()})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    outcome = yield
    if _mine(item.config):
        exc = outcome.excinfo[1] if outcome.excinfo else None
        _state["raised"][item.nodeid] = (_verdict(exc), type(exc).__name__ if exc is not None else None)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if not _mine(item.config):
        return
    rep = outcome.get_result()
    _state["made"].add(id(rep))
    exc = call.excinfo.value if call.excinfo is not None else None
    raw = _verdict(exc)
    record = {
        "kind": "test",
        "nodeid": item.config.cwd_relative_nodeid(item.nodeid),
        "when": call.when,
        "raw": raw,
        "exc": type(exc).__name__ if exc is not None else None,
        "report": getattr(rep, "outcome", None),
        "wasxfail": hasattr(rep, "wasxfail"),
    }
    if call.when == "call":
        hooked = _state["raised"].pop(item.nodeid, ("missing", None))
        record["call_hook"] = hooked[0]
        if raw == "passed" and hooked[0] not in ("passed", "missing"):
            record["raw"] = hooked[0]  # the call raised, yet call.excinfo holds nothing
    if raw in ("xfailed", "skipped"):
        record["raised_in"] = _where(call.excinfo)
    _emit(record)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report):
    if _state["config"] is not None and id(report) not in _state["made"]:
        _emit({"kind": "unmade", "nodeid": getattr(report, "nodeid", "?"), "report": report.outcome})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    yield
    config = session.config
    if not _mine(config) or _state["snapshot"] is None:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    stats = None if reporter is None else {}  # None: no terminal reporter (-p no:terminal)
    for key, reports in (getattr(reporter, "stats", None) or {}).items():
        counted = [r for r in reports if getattr(r, "when", None) in ("setup", "call", "teardown")]
        stats[key] = len(counted)
    _emit(
        {
            "kind": "finish",
            "nonce": _NONCE,
            "exitstatus": int(session.exitstatus),
            "testsfailed": session.testsfailed,
            "testscollected": session.testscollected,
            "shouldstop": bool(session.shouldstop),
            "stats": stats,
            "changed": _changed(config),
        }
    )
