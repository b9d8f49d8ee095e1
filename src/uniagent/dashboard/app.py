"""The dashboard's JSON API over one or more run stores, and the static front end.

Stores are opened read-only (SQLite WAL lets a running `uniagent run` keep writing); every
request reads the store afresh, so new episodes show up while a run is going. Everything that
leaves the server goes through a `Redactor` first. Bound to a non-loopback address the app
requires a token (header `Authorization: Bearer T`, `?token=T` once, then a cookie).
"""

from __future__ import annotations

import contextlib
import hmac
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from uniagent.dashboard.training import register as register_training
from uniagent.errors import UniAgentError
from uniagent.models.config import ModelConfig
from uniagent.models.registry import tokenizer_spec
from uniagent.redact import MASK, Redactor, redact_logs
from uniagent.runner.store import RunStore, store_path
from uniagent.runner.summary import summarize
from uniagent.tokens.trajectory import version_range

COOKIE = "uniagent_dashboard_token"
ASSETS = {"app.js", "style.css", "training.js"}
LIGHT_FIELDS = (
    "instance_id",
    "sample",
    "exit_reason",
    "trainable",
    "reward",
    "resolved",
    "turns",
    "prompt_tokens",
    "completion_tokens",
    "drift",
    "num_segments",
    "wall_s",
    "attempts",
    "finished_at",
)
"""The columns of the episodes table (no messages, no token segments: those are per episode)."""
LIGHT_SORTS = set(LIGHT_FIELDS) - {"attempts"}


@dataclass
class DashboardConfig:
    run_dirs: list[Path]
    token: str | None = None
    train_dirs: list[Path] = field(default_factory=list)  # trainer.output dirs (dashboard/training.py)
    poll_ms: int = 2000
    redact_extra: list[str] = field(default_factory=list)


class Run:
    """One run store, read-only, with a lock: sqlite connections are not for concurrent cursors."""

    def __init__(self, index: int, run_dir: Path) -> None:
        self.index = index
        self.db = store_path(run_dir)
        self.dir = self.db.parent
        self.name = self.dir.name
        self.store = RunStore(self.db, readonly=True)
        self.lock = threading.Lock()

    def config(self) -> dict[str, Any]:
        with self.lock:
            return self.store.meta("config", {}) or {}

    def tokenizer_spec(self) -> str | None:
        """The tokenizer the run used, as `resolve_model` takes it (None: packaged SmolLM2); a
        `ConfigError` when its engine kind is not registered here."""
        model = self.config().get("model") or {}
        spec = str(model.get("spec") or "local")
        return tokenizer_spec(ModelConfig(spec=spec, tokenizer=model.get("tokenizer") or None))

    def light_rows(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.store.rows(full=False))

    def summary(self) -> dict[str, Any]:
        with self.lock:
            out = summarize(self.store)
            planned = self.store.meta("planned", None)
        rows = self.light_rows()
        out["planned"] = planned if planned is not None else out["episodes"]
        # While a run is going its wall time is not stored yet: measure from the episodes' ends.
        if out.get("tokens_per_s") is None and rows:
            first = min(r["finished_at"] - (r["wall_s"] or 0.0) for r in rows)
            span = max(r["finished_at"] for r in rows) - first
            out["tokens_per_s"] = round(out["completion_tokens"] / span, 2) if span > 0 else None
            out["tokens_per_s_live"] = True
        out["last_finished_at"] = max((r["finished_at"] for r in rows), default=None)
        return out

    def episode(self, instance_id: str, sample: int) -> dict[str, Any] | None:
        with self.lock:
            return self.store.get(instance_id, sample)


class TokenTexts:
    """Per-token text with the run's tokenizer, loaded once per spec, cached per token id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokenizers: dict[str | None, Any] = {}
        self._texts: dict[str | None, dict[int, str]] = {}
        self._special: dict[str | None, set[int]] = {}

    def _tokenizer(self, spec: str | None) -> Any:
        if spec not in self._tokenizers:
            from uniagent.models.loading import load_tokenizer, resolve_model

            tok = load_tokenizer(resolve_model(spec))
            self._tokenizers[spec] = tok
            self._texts[spec] = {}
            self._special[spec] = set(getattr(tok, "all_special_ids", []) or [])
        return self._tokenizers[spec]

    def texts(self, spec: str | None, ids: list[int]) -> tuple[list[str], set[int]]:
        with self._lock:
            tok = self._tokenizer(spec)
            cache = self._texts[spec]
            for i in set(ids) - cache.keys():
                cache[i] = tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            return [cache[i] for i in ids], self._special[spec]


def redact_pieces(pieces: list[str], redactor: Redactor) -> list[str]:
    """Mask every token that overlaps a secret found in the joined text (secrets span tokens):
    the first shows MASK, the rest nothing. Stores written before the runner knew a secret (or
    by older versions) still hold its ids; this hides them on the way out."""
    out = list(pieces)
    for i, j in redactor.token_spans(pieces):
        out[i:j] = [MASK] + [""] * (j - i - 1)
    return out


def _filter_rows(
    rows: list[dict[str, Any]],
    exit_reason: str | None,
    resolved: bool | None,
    trainable: bool | None,
    q: str | None,
) -> list[dict[str, Any]]:
    reasons = {x for x in (exit_reason or "").split(",") if x}
    needle = (q or "").strip().lower()
    return [
        r
        for r in rows
        if (not reasons or r["exit_reason"] in reasons)
        and (resolved is None or r["resolved"] == resolved)
        and (trainable is None or r["trainable"] == trainable)
        and (not needle or needle in r["instance_id"].lower())
    ]


def _sort_rows(rows: list[dict[str, Any]], sort: str, desc: bool) -> list[dict[str, Any]]:
    if sort not in LIGHT_SORTS:
        raise HTTPException(400, f"cannot sort by {sort!r}; use one of {', '.join(sorted(LIGHT_SORTS))}")
    present = [r for r in rows if r[sort] is not None]
    missing = [r for r in rows if r[sort] is None]
    present.sort(key=lambda r: (r[sort], r["instance_id"], r["sample"]), reverse=desc)
    return present + missing  # unknown values (no reward, no drift) always last


def _light(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: row.get(k) for k in LIGHT_FIELDS}
    out["error"] = (row.get("error") or "")[:300] or None
    return out


def segment_summary(index: int, traj: dict[str, Any]) -> dict[str, Any]:
    """One segment's figures for the episode page: why it began and what it holds."""
    mask = traj.get("response_mask") or []
    return {
        "index": index,
        "reason": traj.get("reason") or "start",
        "chain": traj.get("chain") or 0,
        "prompt_tokens": len(traj.get("prompt_ids") or []),
        "response_tokens": len(traj.get("response_ids") or []),
        "model_tokens": sum(mask),
        "context_tokens": len(mask) - sum(mask),
        "num_turns": traj.get("num_turns"),
        "drift": traj.get("drift"),
        "drift_kind": traj.get("drift_kind"),
        "finish_reasons": traj.get("finish_reasons"),
        "versions": version_range(traj.get("response_versions") or [], mask),
    }


def _turns(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Per model turn over all segments in order: its segment, tokens generated, context tokens
    after it (within its segment), finish reason, and timings.

    The agent loop records model and tool time per episode; when it also stores per-turn times
    (`metrics.turn_timings`, a list of dicts) they are shown as they are, otherwise the model
    time is apportioned by generated tokens and marked as an estimate.
    """
    segments = row.get("segments") or []
    metrics = row.get("metrics") or {}
    n = max(int(row.get("turns") or 0), sum(int(t.get("num_turns") or 0) for t in segments))
    turns = [
        {"turn": t, "segment": None, "model_tokens": 0, "context_tokens": 0, "finish_reason": None}
        for t in range(n)
    ]
    first = 0  # the episode-wide index of this segment's first model turn
    for index, traj in enumerate(segments):
        count = int(traj.get("num_turns") or 0)
        for s in traj.get("spans") or []:
            kind, t = s["kind"], first + int(s["turn"])
            if kind == "model" and t < n:
                turns[t]["model_tokens"] += s["end"] - s["start"]
            elif kind == "context" and first < t <= min(n, first + count):
                turns[t - 1]["context_tokens"] += s["end"] - s["start"]
        for k, reason in enumerate((traj.get("finish_reasons") or [])[:count]):
            if first + k < n:
                turns[first + k].update(segment=index, finish_reason=reason)
        first += count
    recorded = metrics.get("turn_timings")
    if isinstance(recorded, list) and recorded:
        for t, timing in enumerate(recorded[:n]):
            if isinstance(timing, dict):
                turns[t].update({k: v for k, v in timing.items() if isinstance(v, int | float)})
        return turns
    model_s = float(metrics.get("model_s") or 0.0)
    total = sum(t["model_tokens"] for t in turns)
    for t in turns:
        share = t["model_tokens"] / total if total else (1 / n if n else 0)
        t["model_s_est"] = round(model_s * share, 6)
    return turns


def annotate_calls(messages: list[dict[str, Any]], parser_name: str) -> list[dict[str, Any]]:
    """Assistant messages whose calls live in the text (models without native tool templates):
    add `parsed` = {thought, tool_calls} (or {format_error}) with the run's parser, for display.
    The stored `content` is left exactly as it was."""
    from uniagent.parsers import get_parser
    from uniagent.parsers.base import ToolFormatError

    try:
        parser = get_parser(parser_name)
    except UniAgentError:
        return messages
    out = []
    for m in messages:
        content = m.get("content")
        if m.get("role") == "assistant" and not m.get("tool_calls") and isinstance(content, str) and content:
            try:
                parsed = parser.parse(content)
                if parsed.calls:
                    calls = [c.to_openai() for c in parsed.calls]
                    m = {**m, "parsed": {"thought": parsed.thought, "tool_calls": calls}}
            except ToolFormatError as exc:
                m = {**m, "parsed": {"format_error": str(exc)}}
            except Exception:  # a display aid only: the raw text is shown anyway
                pass
        out.append(m)
    return out


def create_app(config: DashboardConfig) -> FastAPI:
    runs = [Run(i, d) for i, d in enumerate(config.run_dirs)]
    redactor = Redactor(extra=config.redact_extra)
    redact_logs(redactor)
    texts = TokenTexts()
    static = resources.files("uniagent.dashboard") / "static"

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for run in runs:
            run.store.close()

    app = FastAPI(
        title="uniagent dashboard", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.runs = runs
    app.state.training = register_training(app, config.train_dirs, redactor)

    @app.middleware("http")
    async def require_token(request: Request, call_next: Any) -> Response:
        token = config.token
        if not token:
            return await call_next(request)
        given = request.query_params.get("token")
        auth = request.headers.get("authorization", "")
        for candidate in (given, auth.removeprefix("Bearer ").strip(), request.cookies.get(COOKIE)):
            if candidate and hmac.compare_digest(candidate.encode(), token.encode()):
                break
        else:
            return JSONResponse({"detail": "this dashboard needs ?token=... (printed at start)"}, 401)
        if given and request.method == "GET" and not request.url.path.startswith("/api/"):
            # Move the token from the address bar into an http-only cookie.
            response: Response = RedirectResponse(str(request.url.remove_query_params("token")), 303)
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
            return response
        return await call_next(request)

    def get_run(rid: int) -> Run:
        if not 0 <= rid < len(runs):
            raise HTTPException(404, f"no run {rid}; there are {len(runs)}")
        return runs[rid]

    def get_row(rid: int, instance_id: str, sample: int) -> tuple[Run, dict[str, Any]]:
        run = get_run(rid)
        row = run.episode(instance_id, sample)
        if row is None:
            raise HTTPException(404, f"run {run.name} has no episode {instance_id}#{sample}")
        return run, row

    @app.get("/api/runs")
    def list_runs() -> Any:
        out = []
        for run in runs:
            cfg = run.config()
            out.append(
                {
                    "id": run.index,
                    "name": run.name,
                    "path": str(run.dir),
                    "model": (cfg.get("model") or {}).get("spec"),
                    "tasks": (cfg.get("tasks") or {}).get("spec"),
                    "summary": run.summary(),
                }
            )
        return redactor.data(out)

    @app.get("/api/runs/{rid}")
    def run_detail(rid: int) -> Any:
        run = get_run(rid)
        return redactor.data(
            {
                "id": rid,
                "name": run.name,
                "path": str(run.dir),
                "config": run.config(),
                "summary": run.summary(),
            }
        )

    @app.get("/api/runs/{rid}/series")
    def series(rid: int) -> Any:
        """Reward per episode in the order episodes finished (the reward-over-time chart)."""
        rows = sorted(get_run(rid).light_rows(), key=lambda r: r["finished_at"])
        return [
            {
                "i": i,
                "t": r["finished_at"],
                "reward": r["reward"],
                "resolved": r["resolved"],
                "exit_reason": r["exit_reason"],
                "instance_id": redactor.text(r["instance_id"]),
                "sample": r["sample"],
            }
            for i, r in enumerate(rows)
        ]

    @app.get("/api/runs/{rid}/episodes")
    def episodes(
        rid: int,
        exit_reason: str | None = None,
        resolved: bool | None = None,
        trainable: bool | None = None,
        q: str | None = None,
        sort: str = "finished_at",
        desc: bool = False,
        since: float | None = Query(None, description="only episodes that finished after this time"),
    ) -> Any:
        rows = get_run(rid).light_rows()
        reasons = sorted({r["exit_reason"] for r in rows})
        total = len(rows)
        if since is not None:
            rows = [r for r in rows if r["finished_at"] > since]
        rows = _sort_rows(_filter_rows(rows, exit_reason, resolved, trainable, q), sort, desc)
        return redactor.data(
            {
                "total": total,
                "count": len(rows),
                "exit_reasons": reasons,
                "last_finished_at": max((r["finished_at"] for r in rows), default=since),
                "episodes": [_light(r) for r in rows],
            }
        )

    @app.get("/api/runs/{rid}/episodes/{instance_id}/{sample}")
    def episode(rid: int, instance_id: str, sample: int) -> Any:
        run, row = get_row(rid, instance_id, sample)
        segments = row.pop("segments", None) or []
        out = dict(row)
        parser = str((run.config().get("model") or {}).get("parser") or "hermes")
        out["messages"] = annotate_calls(row.get("messages") or [], parser)
        out["turn_table"] = _turns({**row, "segments": segments})
        out["has_trajectory"] = bool(segments)
        out["num_segments"] = len(segments)
        out["segments"] = [segment_summary(i, t) for i, t in enumerate(segments)]
        return redactor.data(out)

    @app.get("/api/runs/{rid}/episodes/{instance_id}/{sample}/tokens")
    def tokens(
        rid: int,
        instance_id: str,
        sample: int,
        segment: int = Query(0, description="which segment of the episode (0: the first)"),
    ) -> Any:
        """Every token of one segment: [id, text, mask, logprob]; prompt tokens are context (mask 0).
        `versions`: the policy version of each token (-1: not generated in this segment), or None
        when the engine did not say; `version_range`: the oldest and newest of the model tokens."""
        run, row = get_row(rid, instance_id, sample)
        segments = row.get("segments") or []
        if not segments:
            why = "a text-level model, or it ended before its first turn"
            raise HTTPException(404, f"{instance_id}#{sample} has no token trajectory ({why})")
        if not 0 <= segment < len(segments):
            raise HTTPException(
                404, f"{instance_id}#{sample} has {len(segments)} segment(s): segment={segment} is not one"
            )
        traj = segments[segment]
        prompt = list(traj.get("prompt_ids") or [])
        response = list(traj.get("response_ids") or [])
        spec: str | None = "the run's model spec"
        try:
            spec = run.tokenizer_spec()
            pieces, special = texts.texts(spec, prompt + response)
        except UniAgentError as exc:
            name = spec or "packaged SmolLM2"
            raise HTTPException(503, f"cannot load the run's tokenizer ({name}): {exc}") from exc
        shown = redact_pieces(pieces, redactor)
        mask = [0] * len(prompt) + list(traj.get("response_mask") or [])
        logprobs = [0.0] * len(prompt) + list(traj.get("response_logprobs") or [])
        tags = list(traj.get("response_versions") or [])
        known = len(tags) == len(response)
        # A redacted token's id would give the secret back to anyone with the tokenizer: null.
        ids: list[int | None] = [
            None if a != b else tid for tid, a, b in zip(prompt + response, shown, pieces, strict=True)
        ]
        pieces = shown
        return {
            "instance_id": redactor.text(instance_id),
            "sample": sample,
            "segment": segment,
            "reason": traj.get("reason") or "start",
            "segments": [
                {"index": i, "reason": t.get("reason") or "start", "chain": t.get("chain") or 0}
                for i, t in enumerate(segments)
            ],
            "tokenizer": spec or "packaged SmolLM2",
            "prompt_len": len(prompt),
            "drift": traj.get("drift"),
            "spans": [
                {**s, "start": s["start"] + len(prompt), "end": s["end"] + len(prompt)}
                for s in traj.get("spans") or []
            ],
            "special": sorted(special & set(prompt + response)),
            "versions": [-1] * len(prompt) + tags if known else None,
            "version_range": version_range(tags, mask[len(prompt) :]),
            "tokens": [
                [tid, piece, m, round(float(lp), 5)]
                for tid, piece, m, lp in zip(ids, pieces, mask, logprobs, strict=False)
            ],
        }

    @app.get("/api/health")
    def health() -> Any:
        return {"ok": True, "runs": len(runs), "time": time.time(), "poll_ms": config.poll_ms}

    def asset_response(name: str) -> Response:
        media = {"html": "text/html", "js": "text/javascript", "css": "text/css"}[name.rsplit(".", 1)[1]]
        body = (static / name).read_bytes()
        return Response(body, media_type=f"{media}; charset=utf-8", headers={"Cache-Control": "no-store"})

    @app.get("/")
    def index() -> Response:
        return asset_response("index.html")

    @app.get("/static/{name}")
    def asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, "no such file")
        return asset_response(name)

    return app
