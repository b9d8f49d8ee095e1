"""The runner bench's workload, shared by our side (`runner.py`) and the peer's (`runner_peer.py`):
the bundled starter tasks, each episode nine shell commands (eight that look around the repository,
then the gold patch applied with bash) and a submit, scripted as a model would write them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from uniagent.parsers import get_parser
from uniagent.parsers.base import ToolCall
from uniagent.tasks.base import Task
from uniagent.tasks.swe import patch_files

if TYPE_CHECKING:  # the peer's child imports this module: it loads no more of uniagent than it uses
    from uniagent.tokens import ChatCodec

TASKS = "builtin:starter"
MAX_TURNS = 12  # 10 scripted turns; the rest is slack that an unexpected extra turn would show


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


def load_codec() -> ChatCodec:
    """The codec `ModelFactory` builds for a replay model (the packaged SmolLM2 tokenizer)."""
    from uniagent.models.loading import load_tokenizer, resolve_model
    from uniagent.tokens import ChatCodec

    return ChatCodec(load_tokenizer(resolve_model(None)))


def write_script(path: Path, codec: ChatCodec, tasks: list[Task], samples: int) -> Path:
    """The replay file: per `INSTANCE#SAMPLE` request id, ten generations in turn order. Prompts
    are not recorded (observations hold timestamps): `ANY_PROMPT` replays by request id and turn."""
    from uniagent.models.base import Generation
    from uniagent.models.replay import ANY_PROMPT, ReplayRecord, save_records

    records = []
    for task in tasks:
        turns = [codec.encode(t) + codec.eot_ids for t in script_turns(task)]
        for s in range(samples):
            for turn, ids in enumerate(turns):
                gen = Generation(list(ids), [-0.1] * len(ids), "stop")
                records.append(ReplayRecord(f"{task.instance_id}#{s}", gen, turn, None, ANY_PROMPT))
    save_records(records, path, include_prompts=False)
    return path


def samples_for(level: int, n_tasks: int) -> int:
    """Enough samples per task that `level` episodes can run at once (6 at 100, 56 at 1,000)."""
    return max(1, math.ceil(level / n_tasks))
