"""`uniagent tasks make`: validated SWE rows from any Python repository and its test command.

The repository's tests run three times on the clean tree (the baseline: tests that pass every
time, under the same id). Candidate bugs (`uniagent.tasks.mutate`) are injected one at a time into
a sandbox's copy of the tree, the tests run, and a candidate is kept when some baseline tests fail
(FAIL_TO_PASS) while others still pass (PASS_TO_PASS), and a second run agrees (flaky ones are
dropped). Kept bugs with
the same failing-test set are one task (the first in the seeded order). The rows are written by
`uniagent.tasks.made_rows`; their gold patch is the revert of the bug.

The work dir holds the clean tree, the baseline and one result file per candidate, each written
atomically: a rerun with the same work dir skips the candidates already done.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from uniagent import jsonio
from uniagent import sandbox as sandboxes
from uniagent.errors import ConfigError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import SandboxConfig, parse_config
from uniagent.tasks import made_rows, mutate
from uniagent.tasks.swe import is_test_path, parser_name
from uniagent.tasks.witness import LOG_LIMIT

PASSING = ("PASSED", "XFAIL")
FAILING = ("FAILED", "ERROR")
BASELINE_RUNS = 3
_SKIP_DIRS = {".git", ".hg", ".venv", "venv", ".tox", ".nox", ".eggs", "build", "dist", "__pycache__"}
_SKIP_DIRS |= {".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules", "docs", "doc"}


class MakeConfig(BaseModel):
    """What `uniagent tasks make` is asked for (the CLI's flags)."""

    model_config = ConfigDict(extra="forbid")

    source: Path = Field(description="a git repository (its HEAD) or a source tree")
    test_cmd: str = Field(description="runs the tests from the tree's root (pytest -rA)")
    out: Path = Field(description="where tasks.jsonl and the tasks' repository go")
    work: Path | None = Field(None, description="work dir (resumable); default OUT/work")
    workers: int = Field(2, ge=1)
    max_candidates: int | None = Field(50, ge=1)
    seed: int = 0
    paths: list[str] = Field(default_factory=list, description="only mutate files under these (default: all)")
    timeout_s: float | None = Field(None, gt=0, description="per test run; default 5x the baseline + 30 s")
    log_parser: str = "pytest"
    prefix: str | None = Field(None, description="instance id prefix (default: the source's name)")
    statement_model: str | None = Field(None, description="a model spec that writes the problem statements")
    sandbox: dict[str, Any] | None = None

    @property
    def work_dir(self) -> Path:
        return self.work or self.out / "work"

    @property
    def row_test_cmd(self) -> str:
        """The test command of the rows, and of every run here: with a fixed hash seed, so that
        test ids made from sets or dicts (`expected4` in one run, `expected19` in the next) are
        the same when the rows are made and when they are graded."""
        if "PYTHONHASHSEED" in self.test_cmd:
            return self.test_cmd
        return f"export PYTHONHASHSEED=0; {self.test_cmd}"


def snapshot(source: Path, dest: Path) -> None:
    """The tree to make tasks from: a git repository's HEAD (tracked files only), or a source
    tree without its caches, virtualenvs and VCS metadata."""
    if not source.is_dir():
        raise ConfigError(f"tasks make: {source} is not a directory")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if (source / ".git").exists():
        tmp.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(source), "archive", "--format=tar", "HEAD"],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise ConfigError(f"tasks make: git archive of {source} failed: {archive.stderr.decode()[-300:]}")
        subprocess.run(["tar", "xf", "-", "-C", str(tmp)], input=archive.stdout, check=True)
    else:

        def ignore(_dir: str, names: list[str]) -> list[str]:
            return [n for n in names if n in _SKIP_DIRS or n.endswith((".pyc", ".egg-info"))]

        shutil.copytree(source, tmp, ignore=ignore, symlinks=True)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def candidates(tree: Path, cfg: MakeConfig) -> list[mutate.Mutation]:
    """Every candidate bug of the tree's non-test modules, in the seeded order, at most
    `max_candidates`."""
    found: list[mutate.Mutation] = []
    for path in sorted(tree.rglob("*.py")):
        rel = path.relative_to(tree).as_posix()
        parts = rel.split("/")
        if any(p in _SKIP_DIRS or p.startswith(".") for p in parts[:-1]):
            continue
        if is_test_path(rel, set()) or parts[-1] in ("setup.py", "conftest.py", "noxfile.py"):
            continue
        if cfg.paths and not any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in cfg.paths):
            continue
        found += mutate.find(rel, path.read_text(encoding="utf-8"))
    return mutate.sample(found, cfg.max_candidates, cfg.seed)


def parse_log(log: str, parser: str) -> dict[str, str]:
    """Test id -> status, by swebench's parser (the one the rows are graded with)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id="made",
        image="",
        eval_script_list=[],
        repo="",
        version="",
        FAIL_TO_PASS=[],
        PASS_TO_PASS=[],
        log_parser=parser,
    )
    return dict(PARSER_REGISTRY[parser](log, spec))


def failure_messages(log: str, parser: str) -> dict[str, str]:
    """The one-line error pytest's short summary (`-rA`) gives each failing test, by the test id
    the parser reads from that line (it cuts a parametrized id at its first space)."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            _, _, msg = line.partition(" - ")
            for test in parse_log(line, parser):
                out.setdefault(test, msg.strip()[:300])
    return out


class Runner:
    """A sandbox holding the clean tree, where candidate bugs are put in and taken out again."""

    def __init__(self, sandbox: Sandbox, tree: Path, cfg: MakeConfig, timeout: float) -> None:
        self.sandbox, self.tree, self.cfg, self.timeout = sandbox, tree, cfg, timeout
        self.parser = parser_name(cfg.log_parser)

    async def setup(self) -> None:
        await self.sandbox.upload(self.tree, self.sandbox.workdir)

    async def tests(self) -> tuple[dict[str, str], str, bool]:
        """(statuses, log, timed out) of one run of the test command. No bytecode is written:
        a mutated file of the same size and second as its cached bytecode would not be reread."""
        res = await self.sandbox.exec(
            self.cfg.row_test_cmd,
            timeout=self.timeout,
            env={"PYTHONDONTWRITEBYTECODE": "1"},
            session="_make",
            max_output=LOG_LIMIT,
        )
        return parse_log(res.output, self.parser), res.output, res.timed_out

    async def judge(self, m: mutate.Mutation, passing: list[str]) -> dict[str, Any]:
        """Inject `m`, run the tests (twice when it is a keeper), put the file back."""
        t0 = time.perf_counter()
        original = (self.tree / m.path).read_text(encoding="utf-8")
        await self.sandbox.write_file(m.path, m.apply(original))
        try:
            out = await self._verdict(m, passing)
        finally:
            await self.sandbox.write_file(m.path, original)
        return {**out, "seconds": round(time.perf_counter() - t0, 3)}

    async def _verdict(self, m: mutate.Mutation, passing: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"id": m.id, "mutation": m.to_dict(), "kept": False}
        statuses, log, timed_out = await self.tests()
        if timed_out:
            return {**out, "reason": "the tests ran past the timeout"}
        # A test that fails must say so: one that does not run at all (its module no longer
        # imports, or its parametrized id is not the same from run to run) is in neither list.
        f2p = [t for t in passing if statuses.get(t) in FAILING]
        p2p = [t for t in passing if statuses.get(t) in PASSING]
        if not f2p:
            return {**out, "reason": "no test fails" if p2p else "the tests do not run"}
        if not p2p:
            return {**out, "reason": "every test fails"}
        again, _, timed_out = await self.tests()
        if timed_out or [t for t in passing if again.get(t) in FAILING] != f2p:
            return {**out, "reason": "flaky: a second run differs"}
        p2p = [t for t in p2p if again.get(t) in PASSING]
        msgs = failure_messages(log, self.parser)
        failures = {t: msgs.get(t, statuses.get(t) or "did not run") for t in f2p}
        return {**out, "kept": True, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "failures": failures}


def _sandbox_config(cfg: MakeConfig) -> SandboxConfig:
    return parse_config(cfg.sandbox)


async def baseline(cfg: MakeConfig, tree: Path) -> dict[str, Any]:
    """The tests that pass on the clean tree in each of `BASELINE_RUNS` runs (a test that fails
    once is left out, and so is every id of a parametrized test whose ids are not the same in
    every run)."""
    path = cfg.work_dir / "baseline.json"
    if path.exists():
        data: dict[str, Any] = jsonio.loads(path.read_text())
        if data.get("test_cmd") == cfg.row_test_cmd:
            return data
        shutil.rmtree(cfg.work_dir / "results", ignore_errors=True)  # judged by another command
    async with sandboxes.create(_sandbox_config(cfg)) as sb:
        runner = Runner(sb, tree, cfg, cfg.timeout_s or 1800)
        await runner.setup()
        t0 = time.perf_counter()
        first, log, timed_out = await runner.tests()
        seconds = time.perf_counter() - t0
        others = [(await runner.tests())[0] for _ in range(BASELINE_RUNS - 1)]
    runs = [first, *others]
    seen = set().union(*runs)
    unstable = {t for t in seen if any(r.get(t) not in PASSING for r in runs)}
    # Parametrized ids made from a set's order (a set of tuples holding None, whose hash is its
    # address) differ from run to run: the whole test function goes, not only the ids seen to move.
    moving = {t.split("[", 1)[0] for t in unstable if "[" in t}
    passing = sorted(t for t in seen - unstable if t.split("[", 1)[0] not in moving)
    if timed_out or len(passing) < 2:
        raise ConfigError(
            f"tasks make: the tests of {cfg.source} must pass on the clean tree "
            f"({len(passing)} passed{', timed out' if timed_out else ''}): {log.strip()[-600:]}"
        )
    data = {
        "test_cmd": cfg.row_test_cmd,
        "passing": passing,
        "unstable": sorted(unstable),
        "seconds": round(seconds, 3),
    }
    jsonio.write_json_atomic(path, data)
    return data


async def evaluate(
    cfg: MakeConfig,
    tree: Path,
    todo: list[mutate.Mutation],
    passing: list[str],
    timeout: float,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Judge every candidate of `todo` over `cfg.workers` sandboxes, each result written
    atomically to the work dir as it is known."""
    results = cfg.work_dir / "results"
    results.mkdir(parents=True, exist_ok=True)
    queue: asyncio.Queue[mutate.Mutation] = asyncio.Queue()
    for m in todo:
        queue.put_nowait(m)

    async def worker() -> None:
        if queue.empty():
            return
        async with sandboxes.create(_sandbox_config(cfg)) as sb:
            runner = Runner(sb, tree, cfg, timeout)
            await runner.setup()
            while not queue.empty():
                m = queue.get_nowait()
                res = await runner.judge(m, passing)
                jsonio.write_json_atomic(results / f"{m.id}.json", res)
                if progress:
                    progress(res)

    await asyncio.gather(*(worker() for _ in range(min(cfg.workers, len(todo)))))


def load_results(cfg: MakeConfig, order: list[mutate.Mutation]) -> list[dict[str, Any]]:
    results = cfg.work_dir / "results"
    out = []
    for m in order:
        p = results / f"{m.id}.json"
        if p.exists():
            out.append(jsonio.loads(p.read_text()))
    return out


def deduplicate(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kept candidates, one per failing-test set (the first in the seeded order)."""
    seen: set[frozenset[str]] = set()
    out = []
    for r in results:
        key = frozenset(r.get("FAIL_TO_PASS") or [])
        if r.get("kept") and key not in seen:
            seen.add(key)
            out.append(r)
    return out


async def gold_gate(cfg: MakeConfig, rows: list[dict[str, Any]]) -> dict[str, str]:
    """Grade every row's gold patch exactly as an episode is graded (`uniagent verify --gold`) and
    drop from OUT/tasks.jsonl the rows it does not resolve (id -> why): what the validation runs
    cannot see, such as a test id that changes between runs or a repository whose tests change
    pytest's internals (the grader refuses those runs)."""
    from uniagent.tasks.registry import load_tasks
    from uniagent.tasks.swe import SweTask
    from uniagent.tasks.verify import verify

    if not rows:
        return {}
    tasks = [t for t in load_tasks(str(cfg.out / "tasks.jsonl")) if isinstance(t, SweTask)]
    report = await verify(tasks, None, cfg.work_dir / "gold", cfg.workers, _sandbox_config(cfg))
    results = report["instances"].items()
    refused = {i: str(r.get("error") or r["status"]) for i, r in results if r["status"] != "resolved"}
    if refused:
        kept = [r for r in rows if r["instance_id"] not in refused]
        jsonio.write_text_atomic(cfg.out / "tasks.jsonl", "".join(jsonio.dumps(r) + "\n" for r in kept))
    return refused


async def make(
    cfg: MakeConfig,
    progress: Callable[[dict[str, Any]], None] | None = None,
    started: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Make the rows; returns the summary (also written to OUT/summary.json). `started(total,
    done)` is told the number of candidates and how many an earlier run already judged."""
    t0 = time.perf_counter()
    work = cfg.work_dir
    work.mkdir(parents=True, exist_ok=True)
    tree = work / "clean"
    if not tree.exists():
        snapshot(cfg.source, tree)
    base = await baseline(cfg, tree)
    timeout = cfg.timeout_s or 5 * float(base["seconds"]) + 30
    order = candidates(tree, cfg)
    done = {p.stem for p in (work / "results").glob("*.json")} if (work / "results").exists() else set()
    todo = [m for m in order if m.id not in done]
    if started:
        started(len(order), len(order) - len(todo))
    await evaluate(cfg, tree, todo, list(base["passing"]), timeout, progress)
    results = load_results(cfg, order)
    kept = deduplicate(results)
    name = cfg.prefix or cfg.source.resolve().name
    rows = await made_rows.write(
        cfg.out, name, tree, kept, (cfg.row_test_cmd, cfg.log_parser), cfg.statement_model
    )
    refused = await gold_gate(cfg, rows)
    rows = [r for r in rows if r["instance_id"] not in refused]
    reasons: dict[str, int] = {}
    for r in results:
        if not r.get("kept"):
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    summary = {
        "source": str(cfg.source),
        "candidates": len(order),
        "valid": sum(bool(r.get("kept")) for r in results),
        "kept": len(rows),
        "rejected": reasons,
        "gold_not_resolved": refused,
        "baseline_tests": len(base["passing"]),
        "seconds": round(time.perf_counter() - t0, 1),
        "tasks": str(cfg.out / "tasks.jsonl"),
    }
    jsonio.write_json_atomic(cfg.out / "summary.json", summary)
    return summary
