"""`harbor engine`: serve a model with vLLM's OpenAI dialect and weight-transfer endpoints (CPU or CUDA)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("engine")
    def engine(
        model: str = typer.Option(
            "tiny", "--model", help="'tiny' (built locally, offline), a local HF model folder, or a Hub id."
        ),
        revision: str | None = typer.Option(None, "--revision", help="Hub revision of a Hub-id --model."),
        port: int = typer.Option(8000, "--port", help="TCP port to listen on."),
        host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind."),
        seed: int = typer.Option(0, "--seed", help="Seed of the tiny model (same seed, same weights)."),
        served_model_name: str | None = typer.Option(
            None, "--served-model-name", help="Model name clients send; defaults to --model."
        ),
        max_model_len: int | None = typer.Option(
            None,
            "--max-model-len",
            help="Prompt + completion tokens per request (default: the model's limit).",
        ),
        return_tokens_as_token_ids: bool = typer.Option(
            False, "--return-tokens-as-token-ids", help="Logprob tokens read 'token_id:N', as in vLLM."
        ),
        num_threads: int = typer.Option(1, "--num-threads", help="torch CPU threads for generation."),
        max_batch_size: int = typer.Option(
            64, "--max-batch-size", help="Sequences decoded together per step."
        ),
        device: str = typer.Option(
            "cpu", "--device", help="cpu, cuda (the current GPU) or auto (cuda when there is a GPU)."
        ),
        enable_prefix_caching: bool = typer.Option(
            True,
            "--enable-prefix-caching/--no-enable-prefix-caching",
            help="Reuse earlier prompts' keys and values, as vLLM does by default.",
        ),
        log_level: str = typer.Option("info", "--log-level", help="uvicorn log level."),
    ) -> None:
        """Serve MODEL like `vllm serve` does (chat, completions, logprobs, token ids, weight sync over gloo)."""
        import uvicorn

        from engine.config import engine_device
        from engine.errors import EngineConfigError, ModelBuildError
        from engine.server import EngineConfig, create_app

        if device not in ("auto", "cpu", "cuda"):
            raise typer.BadParameter(f"--device {device!r}: expected auto, cpu or cuda")
        config = EngineConfig(
            device=device,
            revision=revision,
            model=model,
            served_model_name=served_model_name,
            seed=seed,
            max_model_len=max_model_len,
            return_tokens_as_token_ids=return_tokens_as_token_ids,
            num_threads=num_threads,
            max_batch_size=max_batch_size,
            enable_prefix_caching=enable_prefix_caching,
        )
        try:  # fail fast with a clear message instead of a traceback from the server's start-up
            engine_device(device)
            if model == "tiny":
                from engine.tiny_model import build_tiny_model

                build_tiny_model(seed)
            else:
                from engine.tiny_model import resolve_model_path

                resolve_model_path(model, seed, revision=revision)
        except (ModelBuildError, EngineConfigError) as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        uvicorn.run(create_app(config), host=host, port=port, log_level=log_level)
