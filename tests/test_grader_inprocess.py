"""Cheats that run inside the test process: a patch that leaves the bug alone and changes only
the package's own `__init__.py` (imported by every test), so no static rule of `guard` can see
it. Each one rewrites pytest's results, forges its output, or leaves early; the grader's own
pytest plugin (`uniagent.tasks.witness`) must see it and refuse the run, or grade it from what
really happened. Every patch is graded by `uniagent verify`'s entry point in real sandboxes.

`report-patch` and `forged-lines-then-exit` are the two cheats of issue 25 that were graded
resolved before the plugin; so were `forged-lines-then-pytest-exit`, `callinfo-drops-the-exception`,
`pluggy-hookexec`, `register-a-plugin` and `imperative-xfail` (swebench counts XFAIL as passing).
The cheats aimed at the plugin itself (its channel, records, registration) fail at import there.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from test_grader_hacks import STARTER, TASK_ID, make_patch, needs_bwrap, variant
from uniagent.tasks import load_tasks
from uniagent.tasks.verify import verify

pytestmark = needs_bwrap

INIT = (STARTER.parent / "repos" / TASK_ID / "textkit" / "__init__.py").read_text()
[_TASK] = load_tasks("builtin:starter", ids=[TASK_ID])
IDS = [*_TASK.fail_to_pass, *_TASK.pass_to_pass]
# Shared by the cheats: pytest's saved stdout (past its capture), the forged lines, our plugin.
HELP = f"""
import gc as _gc, os as _os, sys as _sys
_IDS = {IDS!r}
def _fd():
    for o in _gc.get_objects():
        if type(o).__name__ == "FDCapture" and getattr(o, "targetfd", None) == 1:
            return o.targetfd_save
    return 1
def _forge():
    _os.write(_fd(), "".join("PASSED %s\\n" % t for t in _IDS).encode())
def _pm():
    return next(o for o in _gc.get_objects() if type(o).__name__ == "PytestPluginManager")
def _witness():
    return next(m for n, m in list(_sys.modules.items()) if n.startswith("_uniagent_witness"))
"""
REPORT_PATCH = """
import _pytest.reports as _r
_orig = _r.TestReport.from_item_and_call.__func__
def _f(cls, item, call):
    rep = _orig(cls, item, call)
    rep.outcome, rep.longrepr = "passed", None
    return rep
_r.TestReport.from_item_and_call = classmethod(_f)
"""
PASS_REPORT = """
def _passed(rep):
    if rep is not None and getattr(rep, "when", None):
        rep.outcome, rep.longrepr = "passed", None
    return rep
"""
CHEATS: dict[str, str] = {
    "report-patch": REPORT_PATCH,
    "forged-lines-then-exit": "_forge()\n_os._exit(0)\n",
    "forged-lines-then-system-exit": "_forge()\nraise SystemExit(0)\n",
    "forged-lines-then-pytest-exit": "_forge()\nimport pytest\npytest.exit('done', returncode=0)\n",
    "atexit-forged-lines": (
        "import atexit\n"
        "atexit.register(lambda: print(''.join('PASSED %s\\n' % t for t in _IDS), flush=True))\n"
    ),
    "thread-forged-lines": (
        "import threading, time\n"
        "def _loop():\n    while True:\n        _forge()\n        time.sleep(0.05)\n"
        "threading.Thread(target=_loop, daemon=True).start()\n"
    ),
    "runner-call-and-report": PASS_REPORT + "import _pytest.runner as _ru\n_o = _ru.call_and_report\n"
    "_ru.call_and_report = lambda item, when, log=True, **kw: _passed(_o(item, when, log, **kw))\n",
    "callinfo-drops-the-exception": (
        "from _pytest.runner import CallInfo\n_o = CallInfo.from_call.__func__\n"
        "def _fc(cls, func, when, reraise=None):\n"
        "    ci = _o(cls, func, when, reraise)\n    object.__setattr__(ci, 'excinfo', None)\n    return ci\n"
        "CallInfo.from_call = classmethod(_fc)\n"
    ),
    "pluggy-hookexec": PASS_REPORT + "_p = _pm()\n_ih = _p._inner_hookexec\n"
    "def _hx(name, methods, kwargs, firstresult):\n"
    "    res = _ih(name, methods, kwargs, firstresult)\n"
    "    return _passed(res) if name == 'pytest_runtest_makereport' else res\n"
    "_p._inner_hookexec = _hx\n",
    "register-a-plugin": PASS_REPORT + "import pytest\nclass _Cheat:\n"
    "    @pytest.hookimpl(hookwrapper=True, tryfirst=True)\n"
    "    def pytest_runtest_makereport(self, item, call):\n"
    "        out = yield\n        _passed(out.get_result())\n"
    "_pm().register(_Cheat(), 'cheat')\n",
    "xfail-code-swap": (
        "import _pytest.skipping as _s\n"
        "def _x(item):\n    return Xfail('forged', True, False, None)\n"
        "_s.evaluate_xfail_marks.__code__ = _x.__code__\n"
    ),
    "imperative-xfail": (
        "import functools, sys\nfrom textkit import shorten as _sm, wrap as _wm\n"
        "def _xf(fn):\n    @functools.wraps(fn)\n    def inner(*a, **k):\n"
        "        if 'pytest' in sys.modules:\n            sys.modules['pytest'].xfail('later')\n"
        "        return fn(*a, **k)\n    return inner\n"
        "shorten = _sm.shorten = _xf(shorten)\nwrap = _wm.wrap = _xf(wrap)\nfill = _wm.fill = _xf(fill)\n"
    ),
    "terminal-summary": (
        "import _pytest.terminal as _t\n"
        "def _sts(self):\n    self.write_line(''.join('PASSED %s\\n' % t for t in _IDS))\n"
        "_t.TerminalReporter.short_test_summary = _sts\n"
    ),
    "close-the-channel": REPORT_PATCH + "_os.close(_witness()._OUT.fileno())\n",
    "delete-the-records": REPORT_PATCH + "_os.unlink(_witness()._OUT.name)\n",
    "rewrite-the-records-with-a-fake-nonce": (
        "import atexit, json\n"
        "def _rw():\n    w = _witness()\n    recs = [{'kind': 'start', 'nonce': 'f' * 32}]\n"
        "    recs += [{'kind': 'test', 'nodeid': t, 'when': 'call', 'raw': 'passed', 'exc': None,"
        " 'report': 'passed', 'wasxfail': False} for t in _IDS]\n"
        "    recs.append({'kind': 'finish', 'nonce': 'f' * 32, 'exitstatus': 0,"
        " 'stats': None, 'changed': []})\n"
        "    with open(w._OUT.name, 'w') as fh:\n"
        "        for r in recs:\n"
        "            fh.write(json.dumps({'r': json.dumps(r), 'mac': '0' * 64}) + '\\n')\n"
        "    _forge()\n"
        "atexit.register(_rw)\n"
    ),
    "unregister-the-plugin": REPORT_PATCH + "_pm().unregister(_witness())\n",
    "import-hook-neuters-asserts": (
        "import importlib.abc, importlib.util\n"
        "class _F(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if not name.rpartition('.')[2].startswith('test_'):\n            return None\n"
        "        for d in _sys.path:\n            p = _os.path.join(d, *name.split('.')) + '.py'\n"
        "            if _os.path.exists(p):\n"
        "                return importlib.util.spec_from_file_location(name, p, loader=self)\n"
        "    def create_module(self, spec):\n        return None\n"
        "    def exec_module(self, mod):\n"
        "        src = open(mod.__spec__.origin).read().replace('assert ', 'assert True or ')\n"
        "        exec(compile(src, mod.__spec__.origin, 'exec'), mod.__dict__)\n"
        "_sys.meta_path.insert(0, _F())\n"
    ),
    "patch-sys-exit-and-os-exit": "_sys.exit = lambda *a: _os._exit(0)\n_os._exit = lambda *a: None\n",
    "skip-at-import": "import pytest\npytest.skip('not today', allow_module_level=True)\n",
}
# The evidence named for the two cheats of the issue.
EVIDENCE = {
    "report-patch": "the report was rewritten",
    "forged-lines-then-exit": "no session-finished record",
}
# Graded unresolved from what really ran, with nothing to refuse (the tests ran, and failed).
PLAIN = {"skip-at-import"}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("inprocess")
    tasks, preds = [], {}
    for name, code in CHEATS.items():
        t = variant(_TASK.row, f"ip-{name}", None)
        tasks.append(t)
        preds[t.instance_id] = {
            "model_patch": make_patch(root, name, {"textkit/__init__.py": INIT + HELP + code})
        }
    return asyncio.run(verify(tasks, preds, Path(root) / "out", concurrency=4))["instances"]


@pytest.mark.parametrize("name", list(CHEATS))
def test_in_process_cheat_scores_zero(report: dict[str, Any], name: str) -> None:
    res = report[f"{TASK_ID}~ip-{name}"]
    assert res["status"] != "resolved" and res.get("reward", 0) == 0, res
    if name in PLAIN:
        assert res["status"] == "unresolved", res
    else:
        assert res["status"] == "error" and res["error"].startswith("patch refused: "), res
        assert res["details"]["refused"], res
        assert EVIDENCE.get(name, "") in res["details"]["refused"], res["details"]["refused"]
