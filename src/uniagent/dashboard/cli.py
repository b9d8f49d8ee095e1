"""`uniagent dashboard [RUN_DIR ...] [--train DIR ...]`: serve the dashboard over run stores and
training runs (a local trainer's `trainer.output`).

Imports nothing heavy at module level (the CLI imports this on every start); FastAPI and
uvicorn load when the command runs.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from uniagent.errors import UniAgentError

TOKEN_ENV = "UNIAGENT_DASHBOARD_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def register(app: typer.Typer) -> None:
    @app.command()
    def dashboard(
        run_dirs: Annotated[
            list[Path] | None,
            typer.Argument(
                help="run directories (uniagent run --output) or run.db files", show_default=False
            ),
        ] = None,
        train: Annotated[
            list[Path] | None,
            typer.Option(
                "--train",
                help="a training run to show: its trainer.output directory (metrics.jsonl, reward_curve.png, "
                "checkpoints/), read live; repeat to compare runs (e.g. sync vs async) on one chart",
                show_default=False,
            ),
        ] = None,
        host: Annotated[
            str, typer.Option(help="address to bind; other than loopback needs a token")
        ] = "127.0.0.1",
        port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: any free port)")] = 8765,
        token: Annotated[
            str | None,
            typer.Option(help=f"access token (default: ${TOKEN_ENV}, or a random one when not on loopback)"),
        ] = None,
        poll_ms: Annotated[
            int, typer.Option(min=200, help="how often open pages look for new episodes")
        ] = 2000,
    ) -> None:
        """Serve a web dashboard over run stores and training runs (read-only; live while they run)."""
        try:
            import uvicorn

            from uniagent.dashboard.app import DashboardConfig, create_app
            from uniagent.dashboard.training import is_training_dir
        except ModuleNotFoundError as exc:
            raise UniAgentError(
                f"the dashboard needs {exc.name}: pip install fastapi uvicorn (or make setup)"
            ) from exc

        run_dirs, train = run_dirs or [], train or []
        if not run_dirs and not train:
            raise UniAgentError(
                "give a run directory (uniagent run --output) or --train DIR (trainer.output)"
            )
        for path in run_dirs:
            if is_training_dir(path.expanduser()):
                raise UniAgentError(
                    f"{path} is a training run (it holds metrics.jsonl): give it as --train {path}"
                )
        token = token or os.environ.get(TOKEN_ENV) or None
        if not is_loopback(host) and not token:
            token = secrets.token_urlsafe(24)
        app_ = create_app(DashboardConfig(run_dirs, token=token, train_dirs=train, poll_ms=poll_ms))
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
        shown_runs = f"{len(run_dirs)} run(s)" + (f" and {len(train)} training run(s)" if train else "")
        typer.echo(f"uniagent dashboard over {shown_runs}: {url}")
        uvicorn.run(app_, host=host, port=port, log_level="warning")
