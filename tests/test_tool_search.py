"""`search`: the local BM25 (SQLite FTS5) index and the HTTP retrieval protocol.

The HTTP tests talk to a stand-in retrieval service on 127.0.0.1 (FastAPI + uvicorn), because
no real retrieval service can run on the test machine. It is a real HTTP server speaking the
protocol in `uniagent.tools.search`'s docstring, so httpx, the retries and the response checks
run for real; only the ranking behind it is scripted.
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from http_helpers import serve_app
from uniagent.errors import ToolError
from uniagent.tools import SearchTool, build_tools
from uniagent.tools.search import forget_indexes, fts_query, load_index

DOCS = [
    {"id": "photo", "title": "Photosynthesis", "text": "Plants use chlorophyll to turn sunlight into sugar."},
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France, on the Seine."},
    {"id": "seine", "title": "Seine", "text": "The Seine flows through Paris to the English Channel."},
    {"id": "lyon", "title": "Lyon", "text": "Lyon lies where the Rhone meets the Saone, in France."},
    {"id": "ops", "title": "Boolean logic", "text": "AND, OR and NOT combine conditions; NEAR is fuzzy."},
]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DOCS) + "\n")
    return path


@pytest.fixture
def tool(corpus, tmp_path):
    forget_indexes()
    yield SearchTool(corpus=str(corpus), cache_dir=str(tmp_path / "cache"))
    forget_indexes()


async def ids(tool: SearchTool, query: str, k: int = 5) -> list[str]:
    res = await tool.call({"query": query, "k": k}, None)  # search needs no sandbox
    assert res.ok, res.text
    return res.metadata["ids"]


# -- local BM25 ---------------------------------------------------------------------------
async def test_ranking_prefers_the_best_passage(tool):
    assert (await ids(tool, "chlorophyll sunlight"))[0] == "photo"
    assert (await ids(tool, "capital of France"))[0] == "paris"
    assert (await ids(tool, "river through Paris"))[:2] == ["seine", "paris"]
    # Stemming: "flowing" finds "flows".
    assert (await ids(tool, "flowing"))[0] == "seine"
    assert await ids(tool, "capital France", k=1) == ["paris"]


async def test_output_lists_numbered_passages_with_title_and_id(tool):
    res = await tool.call({"query": "Seine"}, None)
    first, second = res.text.split("\n\n")
    assert first.startswith("[1] Seine (id: seine)\nThe Seine flows")
    assert second.startswith("[2] Paris (id: paris)\n")
    res = await tool.call({"query": "zebra"}, None)
    assert res.ok and res.text.startswith("No passages matched 'zebra'")


@pytest.mark.parametrize(
    "query",
    [
        '"foo AND (bar',
        "NEAR(paris",
        "paris*",
        "title:paris",
        "^paris",
        'AND OR NOT "',
        "-paris +lyon",
        "{a b}",
    ],
)
async def test_fts5_syntax_in_queries_never_raises(tool, query):
    res = await tool.call({"query": query}, None)
    assert res.ok


async def test_fts5_operators_are_searched_as_words(tool):
    assert (await ids(tool, "NEAR AND"))[0] == "ops"
    assert fts_query('"foo AND (bar') == '"foo" OR "and" OR "bar"'
    assert fts_query("?! ()") is None


async def test_query_without_words_and_bad_arguments(tool):
    res = await tool.call({"query": "?!"}, None)
    assert res.status == "error" and "no words" in res.text
    res = await tool.call({"query": ""}, None)
    assert res.status == "error" and "`query`: String should have at least 1 character" in res.text
    res = await tool.call({"query": "x", "k": 0}, None)
    assert res.status == "error" and "`k`: Input should be greater than or equal to 1" in res.text


async def test_k_defaults_and_is_capped(corpus, tmp_path):
    small = SearchTool(corpus=str(corpus), cache_dir=str(tmp_path / "c"), default_k=1, max_k=2)
    assert len(await ids(small, "France Paris Seine Lyon", k=None)) == 1
    assert len(await ids(small, "France Paris Seine Lyon", k=50)) == 2
    assert "`k` defaults to 1, at most 2" in small.spec()["function"]["description"]


async def test_passages_are_clipped(corpus, tmp_path):
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"id": 1, "title": "Long", "text": "word " * 1000}) + "\n")
    clip = SearchTool(corpus=str(long), cache_dir=str(tmp_path / "c"), passage_chars=100)
    res = await clip.call({"query": "word"}, None)
    body = res.text.split("\n", 1)[1]
    assert body.endswith(" [...]") and len(body) <= 110


async def test_index_is_cached_on_disk_and_shared_in_process(corpus, tmp_path):
    cache = tmp_path / "cache"
    forget_indexes()
    first = load_index(corpus, cache)
    assert not first.from_cache and first.size == len(DOCS)
    files = list(cache.glob("*.sqlite"))
    assert len(files) == 1
    # Same process: the same object, even from another tool instance.
    assert load_index(corpus, cache) is first
    other = SearchTool(corpus=str(corpus), cache_dir=str(cache))
    assert (await ids(other, "Lyon"))[0] == "lyon"
    assert load_index(corpus, cache) is first
    # A new process (simulated): the disk cache is used, nothing is rebuilt.
    forget_indexes()
    mtime = files[0].stat().st_mtime_ns
    again = load_index(corpus, cache)
    assert again.from_cache and files[0].stat().st_mtime_ns == mtime
    # Changed content means a new key and a new index.
    corpus.write_text(corpus.read_text() + json.dumps({"id": "new", "text": "zebra crossing"}) + "\n")
    forget_indexes()
    changed = load_index(corpus, cache)
    assert not changed.from_cache and changed.size == len(DOCS) + 1
    assert len(list(cache.glob("*.sqlite"))) == 2
    assert [p.id for p in changed.search("zebra", 3)] == ["new"]
    forget_indexes()


async def test_directory_corpus(tmp_path):
    docs = tmp_path / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / "guide" / "install.md").write_text("# Installing\n\nRun pip install to set things up.\n")
    (docs / "notes.txt").write_text("Remember to water the cactus.\n")
    (docs / "skip.py").write_text("cactus = True\n")
    (docs / ".hidden.md").write_text("cactus cactus cactus\n")
    forget_indexes()
    tool = SearchTool(corpus=str(docs), cache_dir=str(tmp_path / "c"))
    assert await ids(tool, "cactus") == ["notes.txt"]
    res = await tool.call({"query": "pip install"}, None)
    assert res.text.startswith("[1] Installing (id: guide/install.md)")
    forget_indexes()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"id": 1, "text": "ok"}\nnot json\n', "line 2: not valid JSON"),
        ('{"id": 1, "title": "no text"}\n', 'line 1: expected an object with a "text" string'),
    ],
)
async def test_bad_corpus_lines_are_named(tmp_path, content, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    forget_indexes()
    tool = SearchTool(corpus=str(bad), cache_dir=str(tmp_path / "c"))
    with pytest.raises(ToolError, match=message):
        await tool.call({"query": "ok"}, None)
    assert not list((tmp_path / "c").glob("*"))  # no half-built index is left behind


def test_config_needs_exactly_one_backend(corpus):
    with pytest.raises(ToolError, match="set exactly one of `corpus`"):
        build_tools([{"name": "search", "corpus": str(corpus), "url": "http://127.0.0.1:1"}])


# -- HTTP backend (stand-in service) ------------------------------------------------------
class Script:
    """What the stand-in service does next; tests set it, the server thread reads it."""

    def __init__(self) -> None:
        self.failures: list[int] = []
        self.body: Any = None
        self.seen: list[dict[str, Any]] = []
        self.headers: list[str | None] = []


@pytest.fixture(scope="module")
def service():
    holder = {"script": Script()}
    app = FastAPI()

    @app.post("/search")
    async def search(request: Request) -> Any:
        script = holder["script"]
        body = await request.json()
        script.seen.append(body)
        script.headers.append(request.headers.get("x-key"))
        if script.failures:
            return JSONResponse({"error": "scripted"}, status_code=script.failures.pop(0))
        if script.body is not None:
            return script.body
        words = set(re.findall(r"\w+", body["query"].lower()))
        scored = [
            {**d, "score": float(len(words & set(re.findall(r"\w+", d["text"].lower()))))} for d in DOCS
        ]
        scored.sort(key=lambda d: -d["score"])
        return scored[: body["k"]]

    with serve_app(app) as url:
        yield f"{url}/search", holder


@pytest.fixture
def remote(service):
    url, holder = service
    holder["script"] = Script()
    return url, holder["script"]


async def test_http_backend_posts_query_and_k(remote):
    url, script = remote
    tool = SearchTool(url=url, headers={"x-key": "k1"})
    res = await tool.call({"query": "capital France", "k": 2}, None)
    assert res.ok and res.metadata["ids"] == ["paris", "lyon"]
    assert res.text.startswith("[1] Paris (id: paris)\nParis is the capital")
    assert script.seen == [{"query": "capital France", "k": 2}]
    assert script.headers == ["k1"]


async def test_http_backend_retries_then_succeeds(remote):
    url, script = remote
    script.failures = [503, 429]
    tool = SearchTool(url=url, retries=2, backoff_s=0.01)
    res = await tool.call({"query": "Seine"}, None)
    assert res.ok and len(script.seen) == 3


async def test_http_backend_gives_up_loudly(remote):
    url, script = remote
    script.failures = [500, 500, 500]
    with pytest.raises(ToolError, match=r"failed after 3 attempts: HTTP 500"):
        await SearchTool(url=url, retries=2, backoff_s=0.01).call({"query": "x"}, None)
    script.failures = [404]
    with pytest.raises(ToolError, match="refused the request: HTTP 404"):
        await SearchTool(url=url, retries=2, backoff_s=0.01).call({"query": "x"}, None)
    assert len(script.seen) == 4  # a 4xx is not retried


async def test_http_backend_checks_the_response(remote):
    url, script = remote
    script.body = {"results": [{"id": 7, "title": "T", "text": "wrapped", "score": 1.5}]}
    res = await SearchTool(url=url).call({"query": "x"}, None)
    assert res.text == "[1] T (id: 7)\nwrapped"
    script.body = [{"id": "a", "title": "no text"}]
    with pytest.raises(ToolError, match=r'other than a JSON list of \{"id", "title", "text", "score"\}'):
        await SearchTool(url=url).call({"query": "x"}, None)


async def test_http_backend_unreachable(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here now
    tool = SearchTool(url=f"http://127.0.0.1:{port}/search", retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(ToolError, match="failed after 2 attempts: ConnectError"):
        await tool.call({"query": "x"}, None)
