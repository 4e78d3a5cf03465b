"""`harbor inspect`: the Gradio trace inspector on a trace store, read-only."""

from __future__ import annotations

import typer


def inspect_store(
    store: str | None = typer.Option(
        None,
        "--store",
        help="Trace store: a SQLite file's path or a SQLAlchemy URL (default <runs dir>/traces.db); "
        "opened read-only.",
    ),
    port: int = typer.Option(7860, "--port", help="Port the inspector listens on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Local tokenizer.json or Hugging Face model folder for every rollout's token text (default: "
        "each rollout's model's: the tiny model, a local model folder or the Hugging Face cache; else ids).",
    ),
) -> None:
    """Browse rollouts: filter and sort them, open one to see its graph, messages, tool calls and trained tokens."""
    import uvicorn
    from fastapi import FastAPI
    from rich.console import Console

    from capture_proxy.store import as_store_url, default_store_url
    from capture_proxy.store.engine import redact
    from inspector.app import mount_inspector
    from inspector.errors import InspectorError
    from inspector.tokens import load_decoder

    console = Console(stderr=True)
    url = as_store_url(store) if store else default_store_url()
    try:
        decode = load_decoder(tokenizer) if tokenizer else None
        app = mount_inspector(FastAPI(title="Harbor-RL trace inspector"), url, "/", decode=decode)
    except InspectorError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"[bold]trace inspector[/] on http://{host}:{port}/  store: {redact(url)} (read-only)")
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect_store)
