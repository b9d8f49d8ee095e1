"""Token-level engines over vLLM and SGLang servers (`vllm:URL,...`, `sglang:URL,...`).

No real vLLM or SGLang ran for these tests: both need a GPU, and this machine has none. The servers
here are loopback fakes (aiohttp) that answer with request/response pairs in
tests/fixtures/remote/{vllm,sglang}/*.json, written from the servers' documented formats (each file's
`source` names the source/doc location of every field) with token ids from the real SmolLM2
tokenizer. Everything else is real: RemoteEngine and its dialects, httpx over real sockets, the real
SmolLM2 codec, TokenChatModel, the registry, and (last test) the runner with a real bubblewrap sandbox.
Each test also checks that the body we send is the recorded request (same fields and values; only the
per-call id differs), so a change of the wire format shows up here.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent_helpers import call
from conftest import needs_bwrap
from dashboard_helpers import free_port
from uniagent.errors import ConfigError, EngineError
from uniagent.models.base import SamplingParams
from uniagent.models.config import ModelConfig
from uniagent.models.registry import engine_kind
from uniagent.models.remote.base import RemoteEngine
from uniagent.models.remote.config import RemoteConfig
from uniagent.models.remote.sglang import SGLangDialect
from uniagent.models.remote.vllm import VLLMDialect
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.tokens import ChatCodec

FIXTURES = Path(__file__).parent / "fixtures" / "remote"
DIALECTS = {"vllm": VLLMDialect, "sglang": SGLangDialect}
PROMPT_KEY = {"vllm": "prompt", "sglang": "input_ids"}
ID_KEY = {"vllm": "request_id", "sglang": "rid"}
MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
SAMPLING = SamplingParams(temperature=0.7, top_p=1.0, max_tokens=64, seed=1234, stop_token_ids=[2])
FAST = RemoteConfig(health_interval_s=0.05, backoff_s=0.02, connect_timeout_s=2, health_timeout_s=2)


def exchanges(dialect: str, name: str = "episode") -> list[dict[str, Any]]:
    return json.loads((FIXTURES / dialect / f"{name}.json").read_text())["exchanges"]


def with_tokens(dialect: str, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """A recorded response of `dialect` with other generated tokens (same documented shape)."""
    data = exchanges(dialect)[0]["response"]
    if dialect == "vllm":
        choice = data["choices"][0]
        choice["token_ids"] = ids
        choice["logprobs"]["tokens"] = [f"token_id:{t}" for t in ids]
        choice["logprobs"]["token_logprobs"] = logprobs
    else:
        data["output_ids"] = ids
        data["meta_info"]["output_token_logprobs"] = [
            [lp, t, None] for t, lp in zip(ids, logprobs, strict=True)
        ]
    return data


class FakeServer:
    """One loopback replica of `dialect`: answers a recorded request with its recorded response
    (any other prompt with the first recorded response), or follows `plan`, one action per
    generate request: ("json", body[, status]) | ("hang",) | ("drop",) (cut the connection)."""

    def __init__(self, dialect: str, fixture: str = "episode", port: int | None = None) -> None:
        self.dialect = dialect
        self.exchanges = exchanges(dialect, fixture)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.aborts: list[dict[str, Any]] = []
        self.plan: list[tuple[Any, ...]] = []
        self.health_status = 200
        self.cancelled = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> FakeServer:
        app = web.Application()
        app.router.add_post(DIALECTS[self.dialect].generate_path, self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_post("/abort_request", self._abort)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, shutdown_timeout=0.1).start()
        return self

    async def stop(self) -> None:
        """Like a crash: the port closes and requests in flight lose their connection."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.auth.append(request.headers.get("Authorization"))
        action = self.plan.pop(0) if self.plan else None
        if action is None:
            prompt = body.get(PROMPT_KEY[self.dialect])
            match = [x for x in self.exchanges if x["request"][PROMPT_KEY[self.dialect]] == prompt]
            return web.json_response((match or self.exchanges)[0]["response"])
        if action[0] == "json":
            status = action[2] if len(action) > 2 else 200
            if isinstance(action[1], str):
                return web.Response(text=action[1], status=status)
            return web.json_response(action[1], status=status)
        if action[0] == "drop":
            assert request.transport is not None
            request.transport.abort()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("not reached")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health_status)

    async def _abort(self, request: web.Request) -> web.Response:
        self.aborts.append(await request.json())
        return web.Response(status=200)


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def engine_for(
    dialect: str, *urls: str, timeout_s: float = 30, retries: int = 3, **remote: Any
) -> RemoteEngine:
    cls = DIALECTS[dialect]
    return RemoteEngine(
        list(urls),
        cls(MODEL_NAME) if dialect == "vllm" else cls(),
        FAST.model_copy(update=remote),
        timeout_s=timeout_s,
        retries=retries,
    )


def assert_recorded_request(sent: dict[str, Any], recorded: dict[str, Any], dialect: str) -> None:
    """Same fields and values as the documented request; only the per-call id differs."""
    key = ID_KEY[dialect]
    assert isinstance(sent.get(key), str) and sent[key]
    assert {k: v for k, v in sent.items() if k != key} == {k: v for k, v in recorded.items() if k != key}


# -- an episode, token-exact ----------------------------------------------------------------------
@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_episode_through_token_chat_model_is_token_exact(codec: ChatCodec, dialect: str) -> None:
    server = await FakeServer(dialect).start()
    kind, arg = engine_kind(f"{dialect}:{server.url}")
    engine = await kind.build(arg, ModelConfig(spec=f"{dialect}:{server.url}", name=MODEL_NAME, remote=FAST))
    try:
        model = TokenChatModel(
            engine, codec, get_parser("hermes"), SAMPLING.model_copy(update={"stop_token_ids": []})
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+2?"}]
        first = await model.query(messages)
        messages += [first.message, {"role": "user", "content": "And 3+3?"}]
        second = await model.query(messages)
        messages.append(second.message)
        (traj,) = model.finish(messages)
    finally:
        await engine.aclose()
        await server.stop()

    assert (first.text, second.text) == ("The answer is 4.", "6")
    assert traj.drift is None
    recorded = server.exchanges
    assert len(server.requests) == 2
    for sent, pair in zip(server.requests, recorded, strict=True):
        assert_recorded_request(sent, pair["request"], dialect)
    assert server.requests[0][ID_KEY[dialect]] != server.requests[1][ID_KEY[dialect]], "one call id per turn"
    g1 = [504, 2988, 314, 216, 36, 30, 2]
    g2 = [38, 2]
    cont = recorded[1]["request"][PROMPT_KEY[dialect]][len(traj.prompt_ids) + len(g1) :]
    assert traj.prompt_ids == recorded[0]["request"][PROMPT_KEY[dialect]]
    assert traj.response_ids == g1 + cont + g2
    assert traj.response_mask == [1] * len(g1) + [0] * len(cont) + [1] * len(g2)
    lps = [-0.4172, -0.0931, -0.2215, -0.0046, -0.0718, -0.3387, -0.0012]
    assert traj.response_logprobs[: len(g1)] == lps
    assert traj.response_logprobs[-2:] == [-0.6931, -0.0105]


async def test_vllm_before_0_10_2_ids_come_from_token_id_strings() -> None:
    """A server that ignores `return_token_ids` still names the ids as 'token_id:N' in its logprobs."""
    server = await FakeServer("vllm", "before_0_10_2").start()
    pair = server.exchanges[0]
    assert "token_ids" not in pair["response"]["choices"][0]
    async with engine_for("vllm", server.url) as engine:
        gen = await engine.generate(pair["request"]["prompt"], SAMPLING, "old")
    await server.stop()
    assert gen.token_ids == [504, 2988, 314, 216, 36, 30, 2] and gen.finish_reason == "stop"
    assert gen.logprobs[-1] == -0.0012
    assert_recorded_request(server.requests[0], pair["request"], "vllm")


# -- routing and health ---------------------------------------------------------------------------
async def test_sticky_routing_across_two_replicas() -> None:
    a, b = await FakeServer("vllm").start(), await FakeServer("vllm").start()
    seen: dict[str, set[str]] = {}
    async with engine_for("vllm", a.url, b.url) as engine:
        for turn in range(3):
            for i in range(16):
                rid = f"episode-{i}"
                await engine.generate([1, 2, 3, turn], SAMPLING, rid)
        for server in (a, b):
            for body in server.requests:
                seen.setdefault(body["request_id"].rsplit("-", 1)[0], set()).add(server.url)
    await a.stop()
    await b.stop()
    assert len(seen) == 16 and all(len(urls) == 1 for urls in seen.values()), "all turns on one replica"
    assert a.requests and b.requests, "episodes are spread over both replicas"
    assert len(a.requests) + len(b.requests) == 48


async def test_dead_replica_is_skipped_then_recovers() -> None:
    live = await FakeServer("sglang").start()
    dead_port = free_port()
    dead_url = f"http://127.0.0.1:{dead_port}"
    async with engine_for("sglang", dead_url, live.url, health_interval_s=0.05) as engine:
        for i in range(12):  # some of these ids hash to the dead replica: they move, and succeed
            gen = await engine.generate([1, 2, 3], SAMPLING, f"episode-{i}")
            assert gen.token_ids[-1] == 2
        assert len(live.requests) == 12
        dead = engine.replicas[0]
        assert not dead.healthy and "ConnectError" in dead.reason

        revived = await FakeServer("sglang", port=dead_port).start()
        revived.health_status = 503  # up but not ready: a failed probe keeps it out
        await asyncio.sleep(0.1)
        await engine.generate([1, 2, 3], SAMPLING, "episode-0")
        await until(lambda: revived.health_status == 503 and dead.probe is None and not dead.healthy)
        revived.health_status = 200
        await asyncio.sleep(0.1)
        await engine.generate([1, 2, 3], SAMPLING, "episode-0")  # triggers the probe in the background
        await until(lambda: dead.healthy)
        before = len(revived.requests)
        for i in range(12, 40):  # new episodes are placed on the recovered replica again
            await engine.generate([1, 2, 3], SAMPLING, f"episode-{i}")
        assert len(revived.requests) > before
        moved = [r for r in live.requests if r["rid"].startswith("episode-0-")]
        assert len(moved) >= 2, "an episode moved off the dead replica stays where its cache is"
    await live.stop()
    await revived.stop()


async def test_doctor_rows_and_spec_errors(tmp_path: Path) -> None:
    live = await FakeServer("vllm").start()
    dead_url = f"http://127.0.0.1:{free_port()}"
    kind, arg = engine_kind(f"vllm:{live.url},{dead_url}")
    rows = await kind.doctor(arg, ModelConfig(spec=f"vllm:{arg}", remote=FAST), True)
    await live.stop()
    assert [(name.split()[-1], ok) for name, ok, _ in rows] == [(live.url, True), (dead_url, False)]
    assert "ConnectError" in rows[1][2]
    for bad in ("vllm:ftp://host:1", f"sglang:{live.url},{live.url}", "vllm:,"):
        kind, arg = engine_kind(bad) if bad != "vllm:," else (engine_kind("vllm:x")[0], ",")
        with pytest.raises(ConfigError):
            await kind.build(arg, ModelConfig(spec=bad))
    with pytest.raises(ConfigError, match="needs a value after the colon"):
        engine_kind("sglang:")
    with pytest.raises(ValueError, match="extra"):
        ModelConfig(remote={"retries": 3})


async def test_api_key_seed_and_logprob_settings(monkeypatch, caplog) -> None:
    """`remote.api_key_env` becomes a bearer token (model.api_key_env never does); `send_seed: false`
    leaves the seed out; SGLang's after-temperature logprobs are flagged once at temperature != 1."""
    monkeypatch.setenv("UNIAGENT_TEST_SERVER_KEY", "sk-server")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-token-servers")
    server = await FakeServer("sglang").start()
    cfg = ModelConfig(spec=f"sglang:{server.url}", remote={"api_key_env": "UNIAGENT_TEST_SERVER_KEY"})
    kind, arg = engine_kind(cfg.spec)
    engine = await kind.build(arg, cfg)
    with caplog.at_level("WARNING", logger="uniagent.models.remote.base"):
        await engine.generate([1, 2, 3], SAMPLING, "a")
        await engine.generate([1, 2, 3], SAMPLING, "a")
    warned = [r.getMessage() for r in caplog.records if "after temperature" in r.getMessage()]
    await engine.aclose()
    async with engine_for("sglang", server.url, send_seed=False) as plain:
        await plain.generate([1, 2, 3], SAMPLING, "b")
    await server.stop()
    assert server.auth == ["Bearer sk-server", "Bearer sk-server", None]
    assert server.requests[0]["sampling_params"]["sampling_seed"] == 1234
    assert "sampling_seed" not in server.requests[2]["sampling_params"]
    assert len(warned) == 1 and "temperature 0.7" in warned[0], "once per engine"


# -- retries, timeouts, cancellation, garbage ------------------------------------------------------
async def test_connection_refused_is_retried_until_the_server_is_up() -> None:
    port = free_port()
    async with engine_for("vllm", f"http://127.0.0.1:{port}", retries=8, backoff_s=0.05) as engine:
        task = asyncio.create_task(engine.generate([1, 2, 3], SAMPLING, "late"))
        await asyncio.sleep(0.2)
        server = await FakeServer("vllm", port=port).start()
        gen = await task
    await server.stop()
    assert gen.token_ids[-1] == 2
    assert len(server.requests) == 1, "nothing was sent before the server was up"


async def test_503_is_retried_but_a_500_after_acceptance_is_not() -> None:
    server = await FakeServer("sglang").start()
    server.plan = [("json", {"error": "overloaded"}, 503)]
    async with engine_for("sglang", server.url) as engine:
        gen = await engine.generate([1, 2, 3], SAMPLING, "busy")
        assert gen.finish_reason == "stop" and len(server.requests) == 2

        server.plan = [("json", {"error": "CUDA error: an illegal memory access"}, 500)]
        with pytest.raises(EngineError, match=rf"{server.url}.*HTTP 500.*illegal memory access"):
            await engine.generate([1, 2, 3], SAMPLING, "crash")
        assert len(server.requests) == 3, "a request the server accepted is never sent twice"

        server.plan = [("drop",)]
        with pytest.raises(EngineError, match=rf"{server.url}.*after it was sent.*not retried"):
            await engine.generate([1, 2, 3], SAMPLING, "dropped")
        assert len(server.requests) == 4

        server.plan = [("json", {"error": "overloaded"}, 503)] * 5
        with pytest.raises(EngineError, match=r"HTTP 503.*gave up after 4 attempts"):
            await engine.generate([1, 2, 3], SAMPLING, "always-busy")
    await server.stop()


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_timeout_is_an_engine_error_and_aborts(dialect: str) -> None:
    server = await FakeServer(dialect).start()
    server.plan = [("hang",)]
    async with engine_for(dialect, server.url, timeout_s=0.3) as engine:
        began = time.monotonic()
        with pytest.raises(EngineError, match=rf"{server.url}: request slow-\w+ got no answer within 0.3s"):
            await engine.generate([1, 2, 3], SAMPLING, "slow")
        assert time.monotonic() - began < 2
        await until(lambda: server.cancelled == 1)  # the connection was closed: the server saw it
        if dialect == "sglang":
            await until(lambda: len(server.aborts) == 1)
            assert server.aborts == [{"rid": server.requests[0]["rid"]}]
    await server.stop()


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_cancelled_generate_aborts_server_side(dialect: str) -> None:
    server = await FakeServer(dialect).start()
    server.plan = [("hang",)]
    async with engine_for(dialect, server.url) as engine:
        task = asyncio.create_task(engine.generate([1, 2, 3], SAMPLING, "gone"))
        await until(lambda: len(server.requests) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: server.cancelled == 1)
        if dialect == "sglang":  # SGLang: POST /abort_request with the call's rid, too
            await until(lambda: len(server.aborts) == 1)
            assert server.aborts[0]["rid"] == server.requests[0]["rid"]
        else:
            assert server.aborts == [], "vLLM aborts on a closed connection; it has no abort call"
        assert engine.replicas[0].healthy, "a cancellation says nothing about the replica"
    await server.stop()


GARBAGE = [
    ("vllm", "not json", "not a usable vllm completion"),
    ("vllm", {"choices": []}, "expected one choice"),
    ("vllm", {"choices": [{"text": "hi", "finish_reason": "stop"}]}, "no logprobs"),
    ("vllm", {"choices": [{"logprobs": {"tokens": ["hi"], "token_logprobs": [-1.0]}}]}, "token_id:N"),
    (
        "vllm",
        {"choices": [{"token_ids": [5, 2], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "stop"}]},
        "2 token ids but 1 logprobs",
    ),
    (
        "vllm",
        {"choices": [{"token_ids": [5], "logprobs": {"token_logprobs": [None]}, "finish_reason": "stop"}]},
        "not a list of finite",
    ),
    ("sglang", {"text": "hi", "meta_info": {"finish_reason": {"type": "stop"}}}, "output_token_logprobs"),
    ("sglang", {"meta_info": {"output_token_logprobs": [[-0.5, 7, None]], "finish_reason": None}}, "finish"),
    ("sglang", {"output_ids": [8], "meta_info": {"output_token_logprobs": [[-0.5, 7, None]]}}, "different"),
    ("sglang", {"meta_info": {"output_token_logprobs": [], "finish_reason": {"type": "stop"}}}, "no tokens"),
]


@pytest.mark.parametrize(("dialect", "body", "says"), GARBAGE)
async def test_garbage_answers_are_engine_errors(dialect: str, body: Any, says: str) -> None:
    server = await FakeServer(dialect).start()
    server.plan = [("json", body)]
    async with engine_for(dialect, server.url) as engine:
        with pytest.raises(EngineError, match=rf"{server.url}: request g-\w+: .*{says}"):
            await engine.generate([1, 2, 3], SAMPLING, "g")
        assert len(server.requests) == 1
    await server.stop()


# -- a run against a server that dies ---------------------------------------------------------------
@needs_bwrap
async def test_run_with_vllm_spec_ends_model_error_when_the_server_dies(
    tmp_path: Path, codec: ChatCodec
) -> None:
    from uniagent.runner import RunStore, build_config, run

    server = await FakeServer("vllm").start()
    ids = [*codec.encode(call("bash", command="ls")), 2]
    server.plan = [("json", with_tokens("vllm", ids, [-0.25] * len(ids))), ("hang",)]
    out = tmp_path / "run"
    config = build_config(
        None,
        [
            f"model.spec=vllm:{server.url}",
            "model.remote.health_interval_s=0.05",
            "model.max_retries=1",
            "tasks.spec=builtin:starter",
            "tasks.limit=1",
            f"runner.output={out}",
            "agent.max_turns=4",
        ],
    )

    async def kill_on_second_turn() -> None:
        await until(lambda: len(server.requests) == 2, timeout=120)
        await server.stop()

    killer = asyncio.create_task(kill_on_second_turn())
    await run(config)
    await killer
    rows = list(RunStore(out / "run.db", readonly=True).rows())
    assert len(rows) == 1
    row = rows[0]
    assert row["exit_reason"] == "model_error" and row["trainable"] is False, row
    assert server.url in row["error"] and "not retried" in row["error"]
    assert [m["role"] for m in row["messages"]].count("tool") == 1, "turn 1 came back and its tool ran"
