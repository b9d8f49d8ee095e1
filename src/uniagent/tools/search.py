"""`search(query, k)`: the top-k passages for a query, from a local index or a retrieval service.

Local backend (`corpus`): a JSONL file of `{"id", "title", "text"}` objects (`id` and `title`
optional), or a directory of .txt/.md files (id = relative path, title = first Markdown
heading or the file name). It is indexed with SQLite FTS5 and ranked with FTS5's `bm25()`
(titles weigh twice as much as text). The index is built once per process and cached on disk
under `cache_dir`, keyed by a hash of the corpus content, so a changed corpus gets a new index
and an unchanged one is never rebuilt. Query text is reduced to its words, each quoted, so FTS5
operators or stray quotes in what a model writes are searched as words and never raise.

HTTP backend (`url`): the protocol, for anyone writing a retrieval service:

    POST <url>   Content-Type: application/json
    request:  {"query": "<text>", "k": <int>}
    response: 200, a JSON list, best first, of at most k objects
              [{"id": "<str>", "title": "<str>", "text": "<str>", "score": <float>}, ...]
              (`{"results": [...]}` is accepted as well.)

Connection errors, timeouts, 429 and 5xx are retried with backoff. When the service still
fails, `run` raises `ToolError` rather than telling the model: the model cannot fix a dead
service, and an episode that silently lost its search tool must not be scored as a failure of
the policy.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from uniagent.errors import ToolError
from uniagent.jsonio import atomic_path
from uniagent.sandbox.base import Sandbox
from uniagent.tools.base import Tool, ToolResult

log = logging.getLogger(__name__)

INDEX_VERSION = "fts5-v1"  # part of the cache key: bump when the table layout changes
TITLE_WEIGHT, TEXT_WEIGHT = 2.0, 1.0
MAX_QUERY_TERMS = 32
_TERM = re.compile(r"\w+", re.UNICODE)


@dataclass
class Passage:
    id: str
    title: str
    text: str
    score: float = 0.0


class _PassageIn(BaseModel):
    """One passage as a retrieval service returns it."""

    id: str | int
    title: str = ""
    text: str
    score: float = 0.0


_PASSAGES = TypeAdapter(list[_PassageIn])


def fts_query(text: str) -> str | None:
    """An FTS5 MATCH expression for free text: its words, quoted, OR-ed; None when it has no words.

    Quoting makes every word a plain string to FTS5 (AND, NEAR, `"`, `(` and `*` lose their
    meaning), and OR lets BM25 rank documents that contain only some of the words.
    """
    terms = list(dict.fromkeys(t.lower() for t in _TERM.findall(text)))[:MAX_QUERY_TERMS]
    if not terms:
        return None
    return " OR ".join(f'"{t}"' for t in terms)


# -- corpus ---------------------------------------------------------------------------------
def _corpus_files(corpus: Path) -> list[Path]:
    files = [
        p
        for p in corpus.rglob("*")
        if p.is_file()
        and p.suffix.lower() in (".txt", ".md")
        and not any(part.startswith(".") for part in p.relative_to(corpus).parts)
    ]
    return sorted(files)


def corpus_hash(corpus: Path) -> str:
    """Hash of what the index is built from (file bytes, and names for a directory)."""
    h = hashlib.sha256(INDEX_VERSION.encode())
    files = _corpus_files(corpus) if corpus.is_dir() else [corpus]
    for f in files:
        if corpus.is_dir():
            h.update(b"\0name\0" + str(f.relative_to(corpus)).encode())
        h.update(b"\0data\0")
        with open(f, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def _read_jsonl(path: Path) -> Iterator[tuple[str, str, str]]:
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ToolError(f"search corpus {path}, line {n}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ToolError(
                    f'search corpus {path}, line {n}: expected an object with a "text" string '
                    '(and optional "id", "title")'
                )
            yield str(row.get("id", n)), str(row.get("title") or ""), row["text"]


def _read_dir(corpus: Path) -> Iterator[tuple[str, str, str]]:
    for f in _corpus_files(corpus):
        text = f.read_text(encoding="utf-8", errors="replace")
        first = text.lstrip().split("\n", 1)[0]
        title = first.lstrip("#").strip() if first.startswith("#") else f.stem
        yield str(f.relative_to(corpus)), title, text


class BM25Index:
    """A read-only FTS5 index file. Safe to share between threads (queries are serialised)."""

    def __init__(self, path: Path, *, from_cache: bool) -> None:
        self.path = path
        self.from_cache = from_cache
        self._conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()
        self.size = self._conn.execute("SELECT count(*) FROM passages").fetchone()[0]

    @staticmethod
    def build(corpus: Path, dest: Path) -> None:
        """Index `corpus` into `dest`, atomically (a reader never sees a half-built file)."""
        rows = _read_dir(corpus) if corpus.is_dir() else _read_jsonl(corpus)
        with atomic_path(dest) as tmp:
            conn = sqlite3.connect(tmp)
            try:
                try:
                    conn.execute(
                        "CREATE VIRTUAL TABLE passages USING fts5("
                        "doc_id UNINDEXED, title, text, tokenize='porter unicode61 remove_diacritics 2')"
                    )
                except sqlite3.OperationalError as exc:
                    raise ToolError(
                        f"the local search index needs SQLite with FTS5, which this Python lacks ({exc}); "
                        "use a retrieval service (`url`) instead"
                    ) from None
                with conn:
                    conn.executemany("INSERT INTO passages(doc_id, title, text) VALUES (?, ?, ?)", rows)
                conn.execute("INSERT INTO passages(passages) VALUES ('optimize')")
                conn.commit()
            finally:
                conn.close()

    def search(self, query: str, k: int) -> list[Passage]:
        match = fts_query(query)
        if match is None:
            return []
        sql = (
            f"SELECT doc_id, title, text, bm25(passages, 0.0, {TITLE_WEIGHT}, {TEXT_WEIGHT}) AS rank "
            "FROM passages WHERE passages MATCH ? ORDER BY rank LIMIT ?"
        )
        with self._lock:
            rows = self._conn.execute(sql, (match, k)).fetchall()
        # bm25() is lower-is-better; report higher-is-better like the HTTP protocol.
        return [Passage(str(r[0]), r[1], r[2], -float(r[3])) for r in rows]

    def close(self) -> None:
        self._conn.close()


_indexes: dict[tuple[str, str], BM25Index] = {}
_index_lock = threading.Lock()


def default_cache_dir() -> Path:
    root = os.environ.get("UNIAGENT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "uniagent"
    )
    return Path(root) / "search"


def load_index(corpus: Path, cache_dir: Path | None = None) -> BM25Index:
    """The index of `corpus`: from this process if loaded, else from disk, else built (once)."""
    corpus = corpus.resolve()
    cache_dir = (cache_dir or default_cache_dir()).resolve()
    key = (str(corpus), str(cache_dir))
    with _index_lock:  # builds are rare and slow; one at a time keeps "once per process" simple
        index = _indexes.get(key)
        if index is not None:
            return index
        if not corpus.exists():
            raise ToolError(f"search corpus {corpus} does not exist")
        dest = cache_dir / f"{corpus_hash(corpus)[:32]}.sqlite"
        from_cache = dest.exists()
        if not from_cache:
            cache_dir.mkdir(parents=True, exist_ok=True)
            log.info("building the search index of %s in %s", corpus, dest)
            BM25Index.build(corpus, dest)
        index = _indexes[key] = BM25Index(dest, from_cache=from_cache)
        return index


def forget_indexes() -> None:
    """Drop this process's loaded indexes (the disk cache stays)."""
    with _index_lock:
        for index in _indexes.values():
            index.close()
        _indexes.clear()


# -- the tool -------------------------------------------------------------------------------
class SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, description="What to look for, in plain words.")
    k: int | None = Field(None, ge=1, description="How many passages to return (optional).")


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    corpus: Path | None = Field(None, description="JSONL file or directory of .txt/.md files to index")
    url: str | None = Field(None, description="retrieval service to POST {query, k} to (see module doc)")
    default_k: int = Field(5, ge=1)
    max_k: int = Field(20, ge=1)
    passage_chars: int = Field(1000, ge=50, description="each passage's text is clipped to this")
    cache_dir: Path | None = Field(
        None, description="where indexes are kept; default ~/.cache/uniagent/search"
    )
    timeout_s: float = Field(30.0, gt=0, description="HTTP: per-request timeout")
    retries: int = Field(2, ge=0, description="HTTP: extra attempts after a failed request")
    backoff_s: float = Field(0.5, ge=0, description="HTTP: first retry delay, doubled each time")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP: extra request headers")

    @model_validator(mode="after")
    def _one_backend(self) -> SearchConfig:
        if (self.corpus is None) == (self.url is None):
            raise ValueError(
                "set exactly one of `corpus` (a local BM25 index) or `url` (a retrieval service)"
            )
        return self


class SearchTool(Tool):
    name = "search"
    description = "Search the document collection and return the passages that best match the query."
    Args = SearchArgs
    Config = SearchConfig
    config: SearchConfig

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        if self.config.corpus is not None and not self.config.corpus.exists():
            raise ToolError(f"tool 'search' config: corpus {self.config.corpus} does not exist")

    def describe(self) -> str:
        return f"{self.description} `k` defaults to {self.config.default_k}, at most {self.config.max_k}."

    async def run(self, args: SearchArgs, sandbox: Sandbox | None = None) -> ToolResult:
        k = min(args.k or self.config.default_k, self.config.max_k)
        if fts_query(args.query) is None:
            return ToolResult(
                "The query has no words to search for; write the query as plain words.", status="error"
            )
        passages = await self.search(args.query, k)
        return ToolResult(self.format(args.query, passages), metadata={"ids": [p.id for p in passages]})

    async def search(self, query: str, k: int) -> list[Passage]:
        if self.config.url is not None:
            return await self._search_http(query, k)
        assert self.config.corpus is not None
        index = await asyncio.to_thread(load_index, self.config.corpus, self.config.cache_dir)
        return await asyncio.to_thread(index.search, query, k)

    async def _search_http(self, query: str, k: int) -> list[Passage]:
        url = self.config.url
        assert url is not None
        last = ""
        async with httpx.AsyncClient(timeout=self.config.timeout_s, headers=self.config.headers) as client:
            for attempt in range(self.config.retries + 1):
                if attempt:
                    await asyncio.sleep(self.config.backoff_s * 2 ** (attempt - 1))
                try:
                    resp = await client.post(url, json={"query": query, "k": k})
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    log.warning("search service %s: attempt %d failed: %s", url, attempt + 1, last)
                    continue
                if resp.status_code == 429 or resp.status_code >= 500:
                    last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    log.warning("search service %s: attempt %d failed: %s", url, attempt + 1, last)
                    continue
                if resp.status_code != 200:
                    raise ToolError(
                        f"search service {url} refused the request: HTTP {resp.status_code}: "
                        f"{resp.text[:300]}"
                    )
                return self._parse_response(resp)
        raise ToolError(f"search service {url} failed after {self.config.retries + 1} attempts: {last}")

    def _parse_response(self, resp: httpx.Response) -> list[Passage]:
        try:
            data = resp.json()
            if isinstance(data, dict) and "results" in data:
                data = data["results"]
            rows = _PASSAGES.validate_python(data)
        except (ValueError, ValidationError) as exc:
            raise ToolError(
                f"search service {self.config.url} answered with something other than a JSON list of "
                f'{{"id", "title", "text", "score"}}: {str(exc)[:300]}'
            ) from None
        return [Passage(str(r.id), r.title, r.text, r.score) for r in rows]

    def format(self, query: str, passages: list[Passage]) -> str:
        if not passages:
            return f"No passages matched {query!r}. Try other or fewer keywords."
        parts = []
        for i, p in enumerate(passages, 1):
            text = " ".join(p.text.split())
            if len(text) > self.config.passage_chars:
                cut = text[: self.config.passage_chars]
                text = (cut.rsplit(" ", 1)[0] if " " in cut else cut) + " [...]"
            parts.append(f"[{i}] {p.title or '(untitled)'} (id: {p.id})\n{text}")
        return "\n\n".join(parts)
