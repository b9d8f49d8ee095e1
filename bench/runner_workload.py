"""The runner bench's workload, shared by our side (`runner.py`) and the peer's (`runner_peer.py`):
the bundled starter tasks, each episode nine shell commands (eight that look around the repository,
then the gold patch applied with bash) and a submit, scripted as a model would write them."""

from __future__ import annotations

from uniagent.parsers import get_parser
from uniagent.parsers.base import ToolCall
from uniagent.tasks.base import Task
from uniagent.tasks.swe import patch_files

TASKS = "builtin:starter"


def exploration_commands(task: Task) -> list[str]:
    """Eight commands an agent typically runs before editing: look around the repository."""
    target = patch_files(task.row["patch"])[0]
    package = target.split("/")[0]
    return [
        "ls -la",
        f"cat {target}",
        f"grep -rn 'def ' {package} | head -n 40",
        "git status",
        "git log -1",
        "find . -name '*.py' -not -path './.git/*' | sort",
        f"head -n 30 {package}/__init__.py",
        f"python -c 'import {package}; print({package}.__name__, len(dir({package})))'",
    ]


def apply_command(task: Task) -> str:
    """The gold patch applied with bash, as a model would write it (heredoc into git apply)."""
    return f"git apply <<'UA_EOF'\n{task.row['patch']}UA_EOF\necho applied"


def episode_commands(task: Task) -> list[str]:
    """The nine shell commands of an episode; the tenth turn submits."""
    return [*exploration_commands(task), apply_command(task)]


def script_turns(task: Task, parser: str = "hermes") -> list[str]:
    """The ten model turns of one episode, as text in the model's tool-call format."""
    render = get_parser(parser).render_call
    calls = [ToolCall("bash", {"command": c}) for c in episode_commands(task)]
    return [render(c) for c in [*calls, ToolCall("submit", {})]]
