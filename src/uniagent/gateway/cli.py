"""`uniagent gateway`: serve a model as an OpenAI-compatible, token-recording endpoint."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def gateway(
        model: str = typer.Option("local", "--model", help="local | local:PATH | replay:FILE"),
        host: str = typer.Option(
            "127.0.0.1", "--host", help="interface to bind (non-loopback needs --token)"
        ),
        port: int = typer.Option(8400, "--port", min=0, max=65535),
        token: str | None = typer.Option(
            None, "--token", envvar="UNIAGENT_GATEWAY_TOKEN", help="bearer token clients must send"
        ),
        parser: str = typer.Option("hermes", "--parser", help="tool-call format the model writes"),
        tokenizer: str | None = typer.Option(None, "--tokenizer", help="replay: the tokenizer's model"),
        device: str = typer.Option("cpu", "--device"),
        idle_timeout_s: float = typer.Option(
            1800.0, "--idle-timeout", help="seconds before idle sessions expire"
        ),
    ) -> None:
        """Serve MODEL at http://HOST:PORT/sessions/{id}/v1 (create sessions with POST /sessions)."""
        import asyncio

        from rich.console import Console

        from uniagent.errors import ConfigError
        from uniagent.gateway.app import check_bind

        check_bind(host, token)
        kind, _, arg = model.partition(":")
        if kind not in ("local", "replay") or (kind == "replay" and not arg):
            raise ConfigError(f"--model {model!r}: use local, local:PATH or replay:FILE")

        async def serve() -> None:
            from uniagent.gateway.app import Gateway
            from uniagent.gateway.server import GatewayServer
            from uniagent.models.loading import load_tokenizer, resolve_model
            from uniagent.tokens import ChatCodec

            codec = ChatCodec(load_tokenizer(resolve_model(arg or None if kind == "local" else tokenizer)))
            if kind == "local":
                from uniagent.models.local import LocalEngine

                engine = await LocalEngine.create(arg or None, device=device)
            else:
                from uniagent.models.replay import ReplayEngine

                engine = ReplayEngine.from_jsonl(arg, match="prompt", strict=False)
            gw = Gateway(
                engine, codec, parser=parser, token=token, model_name=model, idle_timeout_s=idle_timeout_s
            )
            server = GatewayServer(gw, host, port, log_level="info")
            Console().print(f"uniagent gateway on http://{host}:{port} (model {model!r}, parser {parser!r})")
            try:
                await server.server.serve()
            finally:
                if hasattr(engine, "aclose"):
                    await engine.aclose()

        asyncio.run(serve())
