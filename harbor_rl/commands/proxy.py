"""`harbor proxy`: the capture proxy on its own, in front of one engine."""

from __future__ import annotations

import secrets

import typer


def proxy(
    upstream: str = typer.Option(
        ..., "--upstream", help="Engine OpenAI base URL (with or without the trailing /v1)."
    ),
    port: int = typer.Option(8300, "--port", help="Port agents and the admin API connect to."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    store: str | None = typer.Option(
        None, "--store", help="Trace store URL (default sqlite:///<runs dir>/traces.db)."
    ),
    admin_key: str | None = typer.Option(
        None,
        "--admin-key",
        envvar="HARBOR_ADMIN_KEY",
        help="Bearer key of the admin routes; generated if absent.",
    ),
    upstream_api_key: str | None = typer.Option(
        None, "--upstream-api-key", envvar="HARBOR_UPSTREAM_API_KEY", help="Key sent to the engine."
    ),
    public_url: str | None = typer.Option(
        None, "--public-url", help="Base URL agents reach this proxy at, if not the one admin requests use."
    ),
    max_body_mb: int = typer.Option(32, "--max-body-mb", help="Largest agent request body accepted, in MiB."),
    stream_mode: str = typer.Option(
        "relay",
        "--stream-mode",
        help="Streamed agent calls: relay (the engine streams, each event passed on as it comes) or "
        "replay (the engine answers whole, replayed as one event stream: less CPU, no early tokens).",
    ),
) -> None:
    """Run the capture proxy: OpenAI-compatible routes for agents, session admin, /health, /metrics."""
    import uvicorn
    from rich.console import Console

    from capture_proxy.app import create_app
    from capture_proxy.config import ProxyConfig
    from capture_proxy.store import TraceStore

    console = Console(stderr=True)
    generated = admin_key is None
    key = admin_key or "hk-admin-" + secrets.token_urlsafe(24)
    # A ValidationError (e.g. an ftp:// upstream) is one line through the CLI layer (harbor_rl.cli).
    config = ProxyConfig(
        upstream_url=upstream,
        upstream_api_key=upstream_api_key,
        admin_key=key,
        public_base_url=public_url,
        max_body_bytes=max_body_mb * 1024 * 1024,
        stream_mode=stream_mode,
    )
    trace_store = TraceStore(store)
    console.print(
        f"[bold]capture proxy[/] on http://{host}:{port} -> {config.upstream_url}  store: {trace_store!r}"
    )
    if generated:
        console.print("generated an admin key (set HARBOR_ADMIN_KEY or --admin-key to choose one):")
        typer.echo(f"admin key: {key}", err=True)  # plain, on one line, for scripts to read
    app = create_app(config, trace_store, close_store=True)
    # Agents pause for minutes between calls while tools run; keep their connections open meanwhile.
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, timeout_keep_alive=75)


def register(app: typer.Typer) -> None:
    app.command("proxy")(proxy)
