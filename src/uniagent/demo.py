"""The demo episode: one short token-level conversation with a model (the local one by default).

It shows the token spine end to end on a laptop CPU: the real SmolLM2 model generates, tools
are described in the system prompt, a tool result is fed back through the codec, and the
trajectory a trainer would receive is printed with its mask. (The full `uniagent run` job
replaces this once the runner exists.)
"""

from __future__ import annotations

import ast
import datetime as _dt
import math
import operator
import time
from dataclasses import dataclass
from typing import Any

from uniagent.errors import ConfigError
from uniagent.models.config import ModelConfig
from uniagent.models.registry import ENGINES
from uniagent.parsers.base import ToolCall

DEMO_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "clock",
            "description": "Return the current UTC date and time.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression such as 17 * 23.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "the expression"}},
                "required": ["expression"],
            },
        },
    },
]


NUDGE = (
    "Call the calculator now, exactly like this: "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'
)


@dataclass
class DemoResult:
    messages: list[dict[str, Any]]
    trajectory: Any
    seconds: float
    tool_calls: int
    format_errors: int
    tokenizer: Any = None  # the model's, to print its tokens


MAX_EXPRESSION_CHARS = 200
MAX_RESULT_BITS = 4096  # about 1,200 digits: any honest arithmetic question fits


def calculate(expr: str) -> int | float:
    """Evaluate `+ - * / // **` on numbers, bounded: a small model may write `9**9**9**9`, whose
    exact value would take Python hours and all memory, so every intermediate integer is kept
    under MAX_RESULT_BITS (checked before the operation runs) and raises ValueError past it."""
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    ops: dict[type, Any] = {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv,
        ast.Pow: operator.pow,
    }

    def bits(x: int | float) -> int:
        return abs(int(x)).bit_length() if isinstance(x, int) else 64

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow):
                if (
                    isinstance(a, int)
                    and isinstance(b, int)
                    and abs(a) > 1
                    and abs(b) * math.log2(abs(a)) > MAX_RESULT_BITS
                ):
                    raise ValueError("result too large (the exponent is too big)")
                if isinstance(b, float) or isinstance(a, float):
                    return float(a) ** float(b)  # floats overflow with an error, not a hang
            elif isinstance(node.op, ast.Mult) and bits(a) + bits(b) > MAX_RESULT_BITS:
                raise ValueError("result too large")
            return ops[type(node.op)](a, b)
        raise ValueError("only numbers, + - * / ** ( ) are allowed")

    return ev(ast.parse(expr, mode="eval").body)


def run_tool(call: ToolCall) -> str:
    """In-process demo tools (real tools run in sandboxes; this demo needs none)."""
    if call.name == "clock":
        return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    if call.name == "calculator":
        expr = str(call.arguments.get("expression", ""))
        if not expr or any(c not in "0123456789+-*/(). " for c in expr):
            return "error: only numbers, + - * / ( ) and spaces are allowed"
        try:
            return str(calculate(expr))
        except Exception as exc:  # a bad expression is an observation, not a crash
            return f"error: {exc}"
    return f"error: unknown tool {call.name!r}"


def demo_model_config(model: str | None, temperature: float = 0.7, max_tokens: int = 96) -> ModelConfig:
    """The demo's `--model`: any token-level spec of the registry; a bare model directory or
    .gguf file (what the demo took before specs) means `local:PATH`."""
    spec = model or "local"
    if spec.partition(":")[0] not in ENGINES:
        spec = f"local:{spec}"
    return ModelConfig(spec=spec, temperature=temperature, max_tokens=max_tokens)


async def run_demo(
    model: str | None = None, turns: int = 3, max_tokens: int = 96, seed: int = 0, temperature: float = 0.7
) -> DemoResult:
    from uniagent.models.factory import ModelFactory

    factory = ModelFactory(demo_model_config(model, temperature, max_tokens))
    if not factory.trainable:
        raise ConfigError(
            f"demo --model {factory.config.spec!r} is text level and has no token trajectory to show; "
            "give a token-level spec (local, local:PATH, a server)"
        )
    await factory.start()
    codec = factory.codec
    # `--seed` seeds the demo's one episode as given (a run spreads its seed over its episodes)
    chat = factory.new_model("demo", 0, sampling={"seed": seed})
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. Use a tool when it helps."},
        {"role": "user", "content": "What is 17 * 23? Use the calculator tool."},
    ]
    started = time.perf_counter()
    calls = errors = 0
    nudged = False
    try:
        for _ in range(turns):
            turn = await chat.query(messages, DEMO_TOOLS)
            messages.append(turn.message)
            if turn.format_error:
                errors += 1
                messages.append({"role": "user", "content": turn.format_error})
            elif turn.tool_calls:
                for call in turn.tool_calls:
                    calls += 1
                    messages.append({"role": "tool", "content": run_tool(call), "tool_call_id": call.id})
            elif calls == 0 and not nudged:
                # Small models often answer directly; ask once for a call so the demo shows
                # context tokens (mask 0) appended between model turns.
                nudged = True
                messages.append({"role": "user", "content": NUDGE})
            else:
                break
        if messages[-1]["role"] != "assistant":
            turn = await chat.query(messages, DEMO_TOOLS)
            messages.append(turn.message)
        (trajectory,) = chat.finish(messages, DEMO_TOOLS)  # append-only: one segment
    finally:
        await factory.close()
    return DemoResult(messages, trajectory, time.perf_counter() - started, calls, errors, codec.tokenizer)
