"""Shared fixtures (the real SmolLM2 tokenizer and model, loaded once per test session) and the
one skip policy of the suite.

Skip policy: a test whose real part (bubblewrap, a container runtime, Chromium, verl, the
shared chat templates, ...) is missing on this machine skips with the reason, through
`require` / `needs` / `require_module` below. Under `CI=true` the same call fails the test
instead, naming the part: CI must never pass by testing less. Parts that cannot exist on the
CI machine (Modal credentials, apptainer) use `pytest.skip` directly and say why.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

import leftovers
from uniagent.models.loading import load_tokenizer, smollm2_source

REPO = Path(__file__).resolve().parents[1]
CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _shared_dir() -> Path:
    """The project's shared/ folder: UNIAGENT_SHARED_DIR, else beside the checkout (../shared),
    else inside it (a copied tree), else in any folder above it (a clone under /tmp/x/y)."""
    if os.environ.get("UNIAGENT_SHARED_DIR"):
        return Path(os.environ["UNIAGENT_SHARED_DIR"])
    candidates = [REPO.parent / "shared", REPO / "shared", *(p / "shared" for p in REPO.parents[1:])]
    for candidate in candidates:
        if (candidate / "chat_templates").is_dir():
            return candidate
    return REPO.parent / "shared"


SHARED_TEMPLATES = _shared_dir() / "chat_templates"


def require(part: str, available: bool, why: str) -> None:
    """Skip the running test when `part` is missing here; under CI=true fail it, naming the part."""
    if available:
        return
    if CI:
        pytest.fail(f"CI=true but {part} is missing: {why}", pytrace=False)
    pytest.skip(f"{part} is missing: {why}", allow_module_level=True)


def needs(part: str, available: bool, why: str) -> pytest.MarkDecorator:
    """`require` as a mark, for a module's `pytestmark` or one test."""
    return pytest.mark.needs(part=part, available=available, why=why)


def require_module(name: str, why: str) -> ModuleType:
    """`pytest.importorskip` under the same policy (at module level a CI failure is a
    collection error that names the module)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        require(f"Python module {name}", False, f"{why} ({exc})")
        raise  # not reached: require skipped or failed


needs_bwrap = needs(
    "bubblewrap", shutil.which("bwrap") is not None, "apt-get install bubblewrap (the local sandbox)"
)


# Parts where any one member suffices (docker or podman): recorded per member, and under CI the
# session fails when none of a group's members was available.
_GROUPS: dict[str, dict[str, str | None]] = {}


def require_one_of(group: str, member: str, available: bool, why: str) -> None:
    """Skip when `member` is missing; CI fails the session at its end if no member of `group` ran."""
    _GROUPS.setdefault(group, {})[member] = None if available else why
    if not available:
        pytest.skip(f"{member} is missing: {why} ({group}: one is enough)", allow_module_level=True)


def missing_groups() -> list[str]:
    return [
        f"{group}: " + "; ".join(f"{m}: {why}" for m, why in members.items())
        for group, members in _GROUPS.items()
        if members and all(why is not None for why in members.values())
    ]


_SESSION: dict[str, object] = {}
"""The session-end leftover check (tests/leftovers.py): the marker, the cgroups there before,
and what was found."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs(part, available, why): a real part this test uses")
    _SESSION["marker"] = leftovers.begin()
    _SESSION["cgroups"] = leftovers.sandbox_cgroups()


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        require(**mark.kwargs)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Runs after every fixture, session-scoped ones included, was torn down: whatever a test
    # started and is still alive now was leaked. Named in the summary, then killed.
    marker = str(_SESSION.get("marker", ""))
    left = leftovers.settle(marker) if marker else []
    _SESSION["left"] = [leftovers.describe(p) for p in left]
    leftovers.kill(left)
    _SESSION["new_cgroups"] = leftovers.leaked_cgroups(_SESSION.get("cgroups", set()))  # type: ignore[arg-type]
    if CI and (missing_groups() or left) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    for line in missing_groups():
        prefix = "CI=true but none of" if CI else "none available of"
        terminalreporter.write_line(f"{prefix} {line}", red=CI, yellow=not CI)
    left = _SESSION.get("left") or []
    if left:
        what = "CI=true: the tests left processes running" if CI else "the tests left processes running"
        terminalreporter.write_line(f"{what} (killed now):", red=CI, yellow=not CI)
        for line in left:  # type: ignore[attr-defined]
            terminalreporter.write_line(f"  {line}", red=CI, yellow=not CI)
    cgroups = _SESSION.get("new_cgroups") or []
    if cgroups:
        terminalreporter.write_line(
            f"sandbox cgroups left with processes inside by a controller that is gone ({len(cgroups)}): "  # type: ignore[arg-type]
            + ", ".join(cgroups[:5]),  # type: ignore[index]
            yellow=True,
        )


@pytest.fixture
def probe_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache for the kernel probes (`uniagent.cpu.cached_probe`), probing on, and the attention and
    linear choices forgotten before and after (each is memoised per process)."""
    from uniagent.models import attention, linear

    monkeypatch.setenv("UNIAGENT_CACHE", str(tmp_path))
    monkeypatch.delenv("UNIAGENT_CPU_PROBE", raising=False)
    for choice in (attention.choice, linear.choice):
        choice.cache_clear()
    yield tmp_path
    for choice in (attention.choice, linear.choice):
        choice.cache_clear()


@pytest.fixture(scope="session")
def smol_source():
    return smollm2_source()


@pytest.fixture(scope="session")
def smol_tokenizer(smol_source):
    return load_tokenizer(smol_source)


@pytest.fixture(scope="session")
def codec(smol_tokenizer):
    """The real SmolLM2 chat codec (template probed once for the whole session)."""
    from uniagent.tokens import ChatCodec

    return ChatCodec(smol_tokenizer)


@pytest.fixture(scope="session")
def smol_engine(smol_source):
    """One LocalEngine (real SmolLM2 weights) shared by the whole session."""
    from uniagent.models.local import LocalEngine

    # bounded: the default budget is half the machine, a quarter of it for kept prefixes, and the
    # session's engine would keep them (GBs) in the test process for the whole run
    engine = LocalEngine(smol_source, memory_budget_bytes=2 << 30, prefix_cache_bytes=256 << 20)
    yield engine
    engine.close()


@pytest.fixture(autouse=True, scope="module")
def _release_memory_after_module():
    """What a module's tests freed goes back to the system before the next module: engines set
    glibc to keep freed heap (local_memory.tune_malloc), and the test process must not carry it into
    the tests that launch multi-GB trainers beside it."""
    yield
    from uniagent.train.outputs import release_memory

    release_memory()


_MEMLOG = os.environ.get("UNIAGENT_TEST_MEMLOG")


@pytest.fixture(autouse=True)
def _memory_log(request: pytest.FixtureRequest):
    """With UNIAGENT_TEST_MEMLOG=FILE, one line per test: the test process's resident MiB before and
    after, and the node's used MiB after (finding what a suite's process keeps)."""
    if not _MEMLOG:
        yield
        return

    from uniagent.train.outputs import rss_mb

    before = round(rss_mb())
    yield
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    used = (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) >> 10
    with open(_MEMLOG, "a") as log:
        log.write(f"{before}\t{round(rss_mb())}\t{used}\t{request.node.nodeid}\n")
