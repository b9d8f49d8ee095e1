"""SWE-rebench tasks (nebius/SWE-rebench, SWE-rebench-leaderboard, SWE-rebench-V2 rows).

A SWE-rebench row is a SWE-bench row whose environment is described by the row itself: its
`install_config` carries the test command (`test_cmd`), the name of the log parser
(`log_parser`, a key of the swebench parser registry such as `parse_log_pytest`) and how the
image was built (`python`, `packages`, `pip_packages`, `pre_install`, `install`, `reqs_path`,
`env_yml_path`, ...). Grading is SweTask's: the agent's patch without test changes on a reset
repository, the row's test patch, the test command, then the swebench parser and report.

What differs from SWE-bench, following the harness SWE-rebench publishes (the
SWE-rebench/SWE-bench-fork of swebench, and SWE-rebench-V2's `scripts/eval.py`):

- the image is the row's `docker_image` or `image_name`; without one, a V1 row's image follows
  the fork's naming, `swerebench/sweb.eval.x86_64.<instance id, lower case, "__" as "_1776_">`;
- V1 repositories live in `/testbed` (a conda env `testbed`); V2 images (rows with a `language`
  or an `install_config.base_image_name`) check out at `/<repository name>`;
- V1 runs `install` again before the tests and appends the test patch's test files to
  `test_cmd`, both under `LANG=C.UTF-8 LC_ALL=C.UTF-8`; V2 runs its `test_cmd` (a string or a
  list of commands, run in order until one fails) as it is;
- JSON-ish fields come as objects, JSON strings, or Python literals (V2 samples), all accepted.

A row with `repo_dir` runs in the local sandbox from that directory instead of an image.
"""

from __future__ import annotations

import logging
from typing import Any

from uniagent.errors import ConfigError
from uniagent.sandbox.base import Sandbox
from uniagent.tasks import witness
from uniagent.tasks.loading import json_field, json_list
from uniagent.tasks.swe import SweTask, split_patch

log = logging.getLogger(__name__)

V1_WORKDIR = "/testbed"
IMAGE_NAMESPACE = "swerebench"
UTF8_ENV = "LANG=C.UTF-8 LC_ALL=C.UTF-8 "
# The V1 images keep the project's environment in conda's `testbed` env; elsewhere (the local
# sandbox, V2 images) there is no conda and this does nothing.
CONDA_ACTIVATE = (
    "if [ -f /opt/miniconda3/bin/activate ]; then "
    ". /opt/miniconda3/bin/activate && conda activate testbed; fi"
)
# Files of a test patch that are data, not tests to run (the fork appends the rest to test_cmd).
_NON_TEST_EXTS_FALLBACK = [".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml"]


def conventional_image(instance_id: str, namespace: str = IMAGE_NAMESPACE) -> str:
    """The image name SWE-rebench's harness uses for an instance it publishes prebuilt."""
    key = instance_id.lower().replace("__", "_1776_")
    return f"{namespace}/sweb.eval.x86_64.{key}:latest"


def _non_test_exts() -> list[str]:
    try:
        from swebench.harness.constants import NON_TEST_EXTS
    except ImportError:  # pragma: no cover - older swebench releases
        return _NON_TEST_EXTS_FALLBACK
    return list(NON_TEST_EXTS)


def patch_test_files(test_patch: str, repo: str = "") -> list[str]:
    """The test files a V1 eval passes to `test_cmd`: files the test patch adds or changes."""
    if repo == "nebius/nebo":  # the fork runs this repository's whole suite
        return []
    exts = _non_test_exts()
    files = []
    for path, chunk in split_patch(test_patch or ""):
        if "\ndeleted file mode " in chunk or "\n+++ /dev/null" in chunk:
            continue
        if not any(path.endswith(ext) for ext in exts):
            files.append(path)
    return files


def is_v2_row(row: dict[str, Any], install_config: dict[str, Any], image: str) -> bool:
    return "language" in row or "base_image_name" in install_config or "swerebenchv2" in image


def _commands(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        return []
    return [c for c in value if isinstance(c, str) and c.strip()]


def _chain(commands: list[str]) -> str:
    """Commands run in order, stopping at the first failure (V2 runs them under `set -e`)."""
    if len(commands) == 1:
        return commands[0]
    return " && ".join("{ " + c + "\n}" for c in commands)


class SweRebenchTask(SweTask):
    family = "swe_rebench"

    def __init__(self, row: dict[str, Any], source: str | None = None) -> None:
        ic = json_field(row.get("install_config"), "install_config", literals=True) or {}
        if not isinstance(ic, dict):
            raise ConfigError("install_config must be an object (or a JSON string of one)")
        # As the fork does, unset (null) settings are the same as absent ones.
        ic = {k: v for k, v in ic.items() if v is not None}
        instance_id = str(row.get("instance_id") or "")
        image = str(row.get("docker_image") or row.get("image_name") or row.get("image") or "")
        if not image and not row.get("repo_dir") and instance_id:
            image = conventional_image(instance_id)
        v2 = is_v2_row(row, ic, image)
        repo_name = str(row.get("repo") or "")

        commands = _commands(ic.get("test_cmd", row.get("test_cmd")))
        if not commands:
            raise ConfigError(f"{instance_id}: install_config has no test_cmd")
        if v2:
            test_cmd = _chain(commands)
            workdir = row.get("workdir") or (f"/{repo_name.split('/')[-1]}" if repo_name else V1_WORKDIR)
            prelude: list[str] = []
        else:
            directives = patch_test_files(row.get("test_patch") or "", repo_name)
            test_cmd = f"{CONDA_ACTIVATE}; {UTF8_ENV}{_chain(commands)}"
            if directives:
                test_cmd += " " + " ".join(directives)
            workdir = row.get("workdir") or V1_WORKDIR
            # The fork's eval script re-runs the install step before the tests (the agent's
            # changes may need a rebuild), after any `eval_commands`; a failure there does not
            # stop the tests (its script runs without `set -e`).
            prelude = _commands(ic.get("eval_commands"))
            install = ic.get("install")
            if isinstance(install, str) and install.strip():
                prelude.append(UTF8_ENV + install)
            if prelude:
                prelude.insert(0, CONDA_ACTIVATE)

        normalized = {
            **row,
            "workdir": workdir,
            "test_cmd": test_cmd,
            "log_parser": ic.get("log_parser") or row.get("log_parser"),
            "FAIL_TO_PASS": json_list(row.get("FAIL_TO_PASS"), "FAIL_TO_PASS", literals=True),
            "PASS_TO_PASS": json_list(row.get("PASS_TO_PASS"), "PASS_TO_PASS", literals=True),
        }
        if image:
            normalized["image"] = image
        super().__init__(normalized, source)
        self.install_config = ic
        self.is_v2 = v2
        self.prelude = "\n".join(prelude)

    async def _run_tests(self, sandbox: Sandbox) -> tuple[str, witness.Evidence]:
        if self.prelude:
            res = await sandbox.exec(
                self.prelude, timeout=1800, cwd=sandbox.workdir, session="_verify", max_output=20_000
            )
            if not res.ok:
                log.warning(
                    "%s: the install step before the tests failed (exit %s): %s",
                    self.instance_id,
                    res.exit_code,
                    res.output.strip()[-500:],
                )
        return await super()._run_tests(sandbox)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "image": self.row.get("image"),
            "workdir": self.row["workdir"] if self.row.get("image") else None,
            "log_parser": self.log_parser,
            "rebench_version": 2 if self.is_v2 else 1,
        }
