"""`harbor engine`: serve a model with vLLM's OpenAI dialect and weight-transfer endpoints (CPU or CUDA).

It takes `vllm serve`'s command line, so one line serves either: `harbor engine MODEL --enable-auto-tool-choice
--tool-call-parser hermes --logprobs-mode processed_logprobs --return-tokens-as-token-ids
--weight-transfer-config '{"backend":"nccl"}'`. What the embedded engine does differently is one line
each: a flag it ignores is noted, a value it cannot honour is refused (engine.vllm_flags).

`--backend vllm` starts the real vLLM instead (its CPU build, from the venv `scripts/setup.sh --with-vllm`
builds; engine.vllm_backend) with the same flags, for conformance checks and machines without a GPU.
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("engine", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def engine(
        ctx: typer.Context,
        model_arg: str | None = typer.Argument(
            None, metavar="[MODEL]", help="As `vllm serve MODEL`: the same as --model.", show_default=False
        ),
        model: str = typer.Option(
            "tiny", "--model",
            help="'tiny' (built locally, offline), 'smollm2-135m' (built once from its PyPI wheel), a .gguf "
            "file, a local HF model folder, or a Hub id.",
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
        dtype: str = typer.Option(
            "auto", "--dtype", help="auto (float32 here), float32/float, bfloat16, float16/half, as in vLLM."
        ),
        return_tokens_as_token_ids: bool = typer.Option(
            False, "--return-tokens-as-token-ids", help="Logprob tokens read 'token_id:N', as in vLLM."
        ),
        enable_auto_tool_choice: bool = typer.Option(  # noqa: ARG001 - accepted: always on here
            False, "--enable-auto-tool-choice", help="vLLM's flag; tool calls are always parsed here."
        ),
        tool_call_parser: str | None = typer.Option(
            None, "--tool-call-parser", help="vLLM's flag; the embedded engine parses hermes tool calls."
        ),
        logprobs_mode: str = typer.Option(
            "processed_logprobs", "--logprobs-mode", help="vLLM's flag; processed_logprobs is what is served."
        ),
        weight_transfer_config: str | None = typer.Option(
            None,
            "--weight-transfer-config",
            help='vLLM\'s JSON, e.g. \'{"backend":"nccl"}\'; gloo is served here.',
        ),
        gpu_memory_utilization: float | None = typer.Option(
            None,
            "--gpu-memory-utilization",
            help="vLLM's flag; ignored (no preallocated KV-cache pool here).",
        ),
        tensor_parallel_size: int = typer.Option(
            1, "--tensor-parallel-size", help="vLLM's flag; 1 only here."
        ),
        trust_remote_code: bool = typer.Option(
            False,
            "--trust-remote-code",
            help="vLLM's flag; ignored (models load with transformers' own code).",
        ),
        num_threads: int = typer.Option(1, "--num-threads", help="torch CPU threads for generation."),
        max_batch_size: int = typer.Option(
            64,
            "--max-batch-size",
            "--max-num-seqs",
            help="Sequences decoded together per step (vLLM's --max-num-seqs).",
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
        backend: str = typer.Option(
            "embedded",
            "--backend",
            help="embedded (this package's engine) or vllm (vLLM's CPU build, from `setup.sh --with-vllm`).",
        ),
    ) -> None:
        """Serve MODEL like `vllm serve` does (chat, completions, logprobs, token ids, weight sync over gloo)."""
        import uvicorn

        if backend not in ("embedded", "vllm"):
            typer.secho(
                f"harbor engine: --backend {backend!r}: expected embedded or vllm", fg="red", err=True
            )
            raise typer.Exit(2)
        if backend == "vllm":
            passthrough = list(ctx.args)  # vLLM flags the embedded engine lacks go to vLLM as they are
            if weight_transfer_config is not None:
                passthrough += ["--weight-transfer-config", weight_transfer_config]
            if gpu_memory_utilization is not None:
                passthrough += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
            if max_batch_size != 64:
                passthrough += ["--max-num-seqs", str(max_batch_size)]
            if not enable_prefix_caching:
                passthrough.append("--no-enable-prefix-caching")
            if trust_remote_code:
                passthrough.append("--trust-remote-code")
            raise typer.Exit(
                _serve_vllm(
                    model_arg or model,
                    revision=revision,
                    seed=seed,
                    host=host,
                    port=port,
                    dtype=dtype,
                    served_model_name=served_model_name or model_arg or model,
                    max_model_len=max_model_len,
                    tool_call_parser=tool_call_parser or "hermes",
                    logprobs_mode=logprobs_mode,
                    device=device,
                    tensor_parallel_size=tensor_parallel_size,
                    extra=passthrough,
                )
            )

        from engine.config import engine_device
        from engine.errors import EngineConfigError, ModelBuildError
        from engine.server import EngineConfig, create_app
        from engine.vllm_flags import VllmFlags

        try:  # fail fast with a clear message instead of a traceback from the server's start-up
            flags = VllmFlags(
                unknown=list(ctx.args), model_arg=model_arg, model=model, dtype=dtype,
                tool_call_parser=tool_call_parser, logprobs_mode=logprobs_mode,
                weight_transfer_config=weight_transfer_config, gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size, trust_remote_code=trust_remote_code,
            )  # fmt: skip
            for note in flags.notes():
                typer.secho(f"harbor engine: {note}", fg=typer.colors.YELLOW, err=True)
            if device not in ("auto", "cpu", "cuda"):
                raise EngineConfigError(f"--device {device!r}: expected auto, cpu or cuda")
            config = EngineConfig(
                device=device,
                revision=revision,
                model=flags.served_model,
                served_model_name=served_model_name,
                seed=seed,
                max_model_len=max_model_len,
                dtype=flags.torch_dtype,
                return_tokens_as_token_ids=return_tokens_as_token_ids,
                num_threads=num_threads,
                max_batch_size=max_batch_size,
                enable_prefix_caching=enable_prefix_caching,
            )
            engine_device(device)
            if config.model == "tiny":
                from engine.tiny_model import build_tiny_model

                build_tiny_model(seed)
            else:
                from engine.tiny_model import resolve_model_path

                resolve_model_path(config.model, seed, revision=revision)
        except (ModelBuildError, EngineConfigError) as exc:
            typer.secho(f"harbor engine: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        uvicorn.run(create_app(config), host=host, port=port, log_level=log_level)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _serve_vllm(
    model: str, *, revision: str | None, seed: int, host: str, port: int, dtype: str, served_model_name: str,
    max_model_len: int | None, tool_call_parser: str, logprobs_mode: str, device: str,
    tensor_parallel_size: int, extra: list[str],
) -> int:  # fmt: skip
    """Run vLLM's OpenAI server in the foreground until it exits or this process is stopped; its exit code."""
    import signal

    from engine import vllm_backend
    from engine.errors import EngineConfigError, ModelBuildError, VllmStartError
    from engine.tiny_model import build_tiny_model, resolve_model_path

    def fail(message: str) -> int:
        typer.secho(f"harbor engine: {message}", fg=typer.colors.RED, err=True)
        return 2

    if device not in ("auto", "cpu"):
        return fail(f"--device {device}: --backend vllm runs vLLM's CPU build; use --device cpu")
    if tensor_parallel_size != 1:
        return fail("--tensor-parallel-size: --backend vllm runs vLLM's CPU build on one process; use 1")
    try:
        vllm_backend.vllm_python()  # before building the model: the missing venv is the likelier mistake
        path = (
            build_tiny_model(seed) if model == "tiny" else resolve_model_path(model, seed, revision=revision)
        )
    except (ModelBuildError, EngineConfigError) as exc:
        return fail(str(exc))
    launch = vllm_backend.VllmLaunch(
        model_path=path, served_model_name=served_model_name, host=host, port=port, dtype=dtype,
        max_model_len=max_model_len, tool_call_parser=tool_call_parser, logprobs_mode=logprobs_mode, extra=extra,
    )  # fmt: skip
    typer.secho(
        f"harbor engine: starting vLLM {vllm_backend.VLLM_CPU_VERSION} (CPU): {' '.join(launch.argv())}",
        err=True,
    )
    # SIGTERM (harbor train's stop, systemd, docker stop) ends this process the way Ctrl-C does, so vLLM is
    # stopped in the `finally` below either way.
    signal.signal(signal.SIGTERM, _interrupt)
    process = vllm_backend.start(launch)
    try:
        took = vllm_backend.wait_until_healthy(
            process, launch.url,
            on_progress=lambda s: typer.secho(
                f"harbor engine: waiting for vLLM at {launch.url}/health ({s:.0f} s; a first start compiles the model)",
                err=True,
            ),
        )  # fmt: skip
        typer.secho(
            f"harbor engine: vLLM serves {served_model_name!r} at {launch.url}/v1 (up in {took:.0f} s)",
            err=True,
        )
        return process.wait()
    except VllmStartError as exc:
        typer.secho(f"harbor engine: {exc}", fg=typer.colors.RED, err=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        vllm_backend.stop(process)
