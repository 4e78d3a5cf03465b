"""`harbor collect`: run rollouts with a teacher and write them as an SFT dataset (optionally to the Hub)."""

from __future__ import annotations

from pathlib import Path

import typer


def collect_command(
    output: Path = typer.Option(
        Path("sft"), "--output", "-o", help="Folder for results.jsonl and metadata.json."
    ),
    dataset: list[str] = typer.Option(
        [],
        "--dataset",
        help="Task dataset (repeatable). Default: the built-in white-box tasks with --provider scripted, else builtin.",
    ),
    harness: str = typer.Option("env-factory", "--harness", help="Harness that runs the teacher."),
    sandbox: str = typer.Option("local", "--sandbox", help="local, docker or e2b."),
    provider: str = typer.Option(
        "openai",
        "--provider",
        help="scripted (no model: a script per built-in environment) or openai (--llm-url).",
    ),
    llm_url: str | None = typer.Option(None, "--llm-url", help="Teacher's OpenAI-compatible base URL."),
    model: str | None = typer.Option(None, "--model", help="Teacher model name."),
    llm_api_key: str | None = typer.Option(
        None,
        "--llm-api-key",
        envvar="HARBOR_LLM_API_KEY",
        help="Key sent to the teacher (never to an agent).",
    ),
    num_episodes: int | None = typer.Option(
        None,
        "--num-episodes",
        "-n",
        min=1,
        help="Episodes; episode i runs task i % tasks (default: one per task).",
    ),
    prefix: str = typer.Option("episode", "--prefix", help="Episode ids are <prefix>-<6 digits>."),
    n_concurrent: int = typer.Option(4, "--n-concurrent", min=1, help="Episodes running at once."),
    task_glob: list[str] = typer.Option([], "--task-glob", help="Only tasks whose id matches. Repeatable."),
    keep_losses: bool = typer.Option(
        False, "--keep-losses", help="Keep every episode, not only reward >= 0."
    ),
    min_reward: float = typer.Option(0.0, "--min-reward", help="Keep episodes with reward >= this."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue an existing output, skipping ids already there."
    ),
    store: str | None = typer.Option(
        None,
        "--store",
        help="Trace store URL (default: <output>/traces.db; open it with harbor inspect --store).",
    ),
    push_to_hub: str | None = typer.Option(
        None, "--push-to-hub", help="Upload to this Hub dataset repo (HF_TOKEN)."
    ),
    private: bool = typer.Option(False, "--private", help="Create the Hub repo as private."),
) -> None:
    """The same rollouts as harbor eval, written as results.jsonl + metadata.json for SFT."""
    import asyncio
    import os

    from pydantic import ValidationError
    from rich.console import Console

    from evaluation.collect import CollectConfig, run_collect
    from evaluation.errors import EvaluationError
    from harbor_server.errors import HarborServerError
    from tasks.errors import TaskError

    console = Console(stderr=True)
    if not dataset:
        dataset = ["env-tasks"] if provider == "scripted" else ["builtin"]
    try:
        config = CollectConfig(
            datasets=dataset,
            harness=harness,
            sandbox=sandbox,
            provider=provider,
            llm_url=llm_url,
            model=model,
            num_episodes=num_episodes,
            prefix=prefix,
            n_concurrent=n_concurrent,
            task_globs=task_glob,
            keep_losses=keep_losses,
            min_reward=min_reward,
        )
    except ValidationError as exc:
        raise typer.BadParameter(
            "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        ) from exc
    try:
        summary = asyncio.run(
            run_collect(
                config,
                out_dir=output,
                resume=resume,
                store_url=store,
                llm_api_key=llm_api_key,
                console=console,
            )
        )
    except (EvaluationError, HarborServerError, TaskError, ValueError) as exc:
        console.print(f"[bold red]harbor collect:[/] {exc}")
        raise typer.Exit(1) from None
    console.print(
        f"{summary.written} episodes in {output / 'results.jsonl'} ({summary.dropped} dropped by should_keep, "
        f"{summary.errors} unscoreable this run)"
    )
    if push_to_hub is not None:
        from evaluation.hub import push_to_hub as push

        url = push(output, push_to_hub, token=os.environ.get("HF_TOKEN"), private=private)
        console.print(f"pushed to {url}")


def register(app: typer.Typer) -> None:
    app.command("collect")(collect_command)
