"""`uniagent gateway`: serve a model as an OpenAI-compatible, token-recording endpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from uniagent.models.factory import ModelFactory


def gateway_factory(spec: str, tokenizer: str | None = None, device: str = "cpu") -> ModelFactory:
    """The gateway's model, from the registry: any token-level kind (a harness in front of a real
    server then records that server's exact tokens); a text-level kind has no tokens to record."""
    from uniagent.errors import ConfigError
    from uniagent.models.config import ModelConfig
    from uniagent.models.factory import ModelFactory

    factory = ModelFactory(ModelConfig(spec=spec, tokenizer=tokenizer, device=device))
    if not factory.trainable:
        raise ConfigError(
            f"--model {spec!r} is text level: the gateway records token ids, so give a token-level "
            "spec (local, local:PATH, replay:FILE or an inference server such as vllm:URL)"
        )
    return factory


def register(app: typer.Typer) -> None:
    from uniagent.models.registry import kinds_help
    from uniagent.parsers.registry import PARSERS

    @app.command()
    def gateway(
        model: str = typer.Option("local", "--model", help=f"a token-level model spec: {kinds_help()}"),
        host: str = typer.Option(
            "127.0.0.1", "--host", help="interface to bind (non-loopback needs --token)"
        ),
        port: int = typer.Option(8400, "--port", min=0, max=65535),
        token: str | None = typer.Option(
            None, "--token", envvar="UNIAGENT_GATEWAY_TOKEN", help="bearer token clients must send"
        ),
        parser: str = typer.Option(
            "hermes", "--parser", help=f"tool-call format the model writes: {PARSERS.choices()}"
        ),
        tokenizer: str | None = typer.Option(
            None, "--tokenizer", help="replay and servers: the tokenizer's model (default: packaged SmolLM2)"
        ),
        device: str = typer.Option("cpu", "--device"),
        idle_timeout_s: float = typer.Option(
            1800.0, "--idle-timeout", help="seconds before idle sessions expire"
        ),
    ) -> None:
        """Serve MODEL at http://HOST:PORT/sessions/{id}/v1 (create sessions with POST /sessions)."""
        import asyncio

        from rich.console import Console

        from uniagent.gateway.app import check_bind

        check_bind(host, token)
        factory = gateway_factory(model, tokenizer, device)

        async def serve() -> None:
            from uniagent.gateway.app import Gateway
            from uniagent.gateway.server import GatewayServer

            await factory.start()
            try:
                gw = Gateway(
                    factory.engine,
                    factory.codec,
                    parser=parser,
                    token=token,
                    model_name=model,
                    idle_timeout_s=idle_timeout_s,
                )
                server = GatewayServer(gw, host, port, log_level="info")
                where = f"http://{host}:{port} (model {model!r}, parser {parser!r})"
                Console().print(f"uniagent gateway on {where}")
                await server.server.serve()
            finally:
                await factory.close()

        asyncio.run(serve())
