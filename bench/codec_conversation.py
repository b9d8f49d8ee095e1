"""A simulated agent episode for bench/codec.py: realistic, deterministic tool output and thoughts.

Kept apart from the timing: what the conversation looks like (a system prompt and a task, then per
turn an assistant message of ~50 tokens, a short thought and a tool call written as text, and a tool
result of 250-300 tokens of `ls`, pytest, grep, git or `cat` output) does not change with how it is
timed, and a fixed seed makes every run of the bench time the same text.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

TURNS = 100
SEED = 1234
TOOL_TOKENS = (250, 300)

Messages = list[dict[str, Any]]

FILES = [
    "src/uniagent/tokens/codec.py",
    "src/uniagent/tokens/probe.py",
    "src/uniagent/tokens/trajectory.py",
    "src/uniagent/models/loading.py",
    "src/uniagent/agent/loop.py",
    "src/uniagent/agent/tools.py",
    "src/uniagent/cli.py",
    "src/uniagent/errors.py",
    "tests/test_codec.py",
    "tests/test_trajectory.py",
    "tests/test_parsers.py",
    "tests/conftest.py",
    "pyproject.toml",
    "README.md",
    "Makefile",
]
WORDS = [
    "token",
    "template",
    "render",
    "encode",
    "decode",
    "probe",
    "boundary",
    "message",
    "assistant",
    "tool",
    "result",
    "drift",
    "mask",
    "prompt",
    "history",
    "turn",
    "cache",
    "tokenizer",
    "codec",
    "append",
    "sequence",
    "generation",
    "parser",
    "schema",
    "config",
]
PY_LINES = [
    "def continuation_ids(self, new_messages: Messages, tools: Tools = None) -> list[int]:",
    '    """Ids to append right after a generation that ended with the end-of-turn token."""',
    "    if not new_messages:",
    '        raise TemplateError("continuation needs at least one new message")',
    "    text = self.render(probe, tools, add_generation_prompt=True)",
    "    at = text.find(ASSISTANT_MARKER)",
    "    after = text[at + len(ASSISTANT_MARKER) :]",
    "    return self._after_eot_ids(after[len(eot) :])",
    "for i in range(n):",
    "    if reference[i] != token_ids[i]:",
    "        return i",
    "import json",
    "from typing import Any",
    "class Trajectory:",
    "    prompt_ids: list[int]",
    "    response_mask: list[int] = field(default_factory=list)",
]


def _ls_lines(rng: random.Random) -> list[str]:
    lines = [f"total {rng.randint(40, 400)}", "drwxr-xr-x  6 agent agent  4096 Nov 29 09:57 ."]
    for _ in range(60):
        name = rng.choice(FILES).split("/")[-1]
        mode = rng.choice(["-rw-r--r--", "-rwxr-xr-x", "drwxr-xr-x"])
        lines.append(
            f"{mode}  1 agent agent {rng.randint(120, 48000):6d} Nov {rng.randint(1, 29):2d} "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {name}"
        )
    return lines


def _pytest_lines(rng: random.Random) -> list[str]:
    test_file = rng.choice([f for f in FILES if f.startswith("tests/")])
    n = rng.randint(20, 90)
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
        "rootdir: /work/repo",
        "configfile: pyproject.toml",
        "plugins: asyncio-0.23.8, timeout-2.3.1, hypothesis-6.108.5",
        f"collected {n} items",
        "",
        f"{test_file} {''.join(rng.choice('....F.s') for _ in range(30))} [ {rng.randint(10, 99)}%]",
        "",
        "=================================== FAILURES ===================================",
        f"_____________________ test_{rng.choice(WORDS)}_{rng.choice(WORDS)} _____________________",
    ]
    for _ in range(40):
        roll = rng.random()
        if roll < 0.5:
            lines.append("    " + rng.choice(PY_LINES).strip())
        elif roll < 0.7:
            lines.append(f"E       AssertionError: assert {rng.randint(0, 50000)} == {rng.randint(0, 50000)}")
        elif roll < 0.85:
            lines.append(f"{test_file}:{rng.randint(10, 400)}: AssertionError")
        else:
            lines.append(f"FAILED {test_file}::test_{rng.choice(WORDS)} - TemplateError: {rng.choice(WORDS)}")
    return lines


def _grep_lines(rng: random.Random) -> list[str]:
    return [f"{rng.choice(FILES)}:{rng.randint(1, 400)}:{rng.choice(PY_LINES)}" for _ in range(60)]


def _git_lines(rng: random.Random) -> list[str]:
    lines = ["On branch main", "Changes not staged for commit:", '  (use "git add <file>..." to update)']
    lines += [f"\tmodified:   {rng.choice(FILES)}" for _ in range(4)]
    lines += ["", f"diff --git a/{FILES[0]} b/{FILES[0]}", "index 3f2a9c1..8be04d7 100644"]
    for _ in range(50):
        lines.append(rng.choice("+- ") + rng.choice(PY_LINES))
    return lines


def _cat_lines(rng: random.Random) -> list[str]:
    return [f"{i:4d}  {rng.choice(PY_LINES)}" for i in range(1, 80)]


OUTPUTS = [
    ("ls -la {d}", _ls_lines),
    ("python -m pytest -x -q {f}", _pytest_lines),
    ("grep -rn {w} src tests", _grep_lines),
    ("git status && git diff", _git_lines),
    ("cat -n {f}", _cat_lines),
]


def tool_output(
    rng: random.Random, make: Callable[[random.Random], list[str]], count: Callable[[str], int]
) -> str:
    """Whole lines of realistic output, between TOOL_TOKENS[0] and TOOL_TOKENS[1] tokens."""
    target = rng.randint(*TOOL_TOKENS)
    text = ""
    for line in make(rng):
        candidate = f"{text}{line}\n"
        if count(candidate) > TOOL_TOKENS[1]:
            break
        text = candidate
        if count(text) >= target:
            break
    return text


def build_conversation(count: Callable[[str], int], turns: int = TURNS) -> tuple[Messages, list[Messages]]:
    """The first prompt and, per turn, [assistant message, tool message]."""
    rng = random.Random(SEED)
    system = (
        "You are a software engineering agent working in the repository /work/repo. You can run shell "
        'commands with the bash tool. To call it, write <tool_call>{"name": "bash", "arguments": '
        '{"command": "..."}}</tool_call> and wait for the result. Keep your reasoning short, make one '
        "change at a time and run the tests after every change. When the task is done, say DONE."
    )
    task = (
        "The test tests/test_codec.py::test_continuation_matches_render fails after the template update. "
        "Find the cause, fix it without changing the public API, and make the whole test suite pass."
    )
    first: Messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    out = []
    thoughts = [
        "The output suggests the {w} handling in {f} is the cause; inspecting it.",
        "Not it yet; the {w} path in {f} still looks suspicious. Checking again.",
        "The edit to {f} applied. Rerunning the checks for the {w} issue.",
        "The traceback points at the {w} branch in {f}; reading the code around it.",
    ]
    for _ in range(turns):
        cmd_template, make = rng.choice(OUTPUTS)
        f = rng.choice(FILES)
        cmd = cmd_template.format(d=f.rsplit("/", 1)[0] if "/" in f else ".", f=f, w=rng.choice(WORDS))
        thought = rng.choice(thoughts).format(w=rng.choice(WORDS), f=f)
        call = json.dumps({"name": "bash", "arguments": {"command": cmd}})
        assistant = {"role": "assistant", "content": f"{thought}\n<tool_call>\n{call}\n</tool_call>"}
        tool = {"role": "tool", "content": tool_output(rng, make, count)}
        out.append([assistant, tool])
    return first, out
