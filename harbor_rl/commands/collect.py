"""`harbor collect`: run rollouts with a teacher and write them as an SFT dataset (optionally to the Hub).

OpenEnv's command line (`openenv collect ENV --base-url URL -o DIR -n N --provider scripted|openai|
anthropic`, openenv 0.10.0 `openenv/cli/commands/collect.py`) works as it is written there: ENV is a
dataset (what `--dataset` takes: OpenEnv's `openspiel:tic_tac_toe` is the OpenSpiel game), `--base-url` a
running `harbor serve` (`harbor serve --dataset openspiel:tic_tac_toe`) where OpenEnv's is the game's
OpenEnv environment server; see `evaluation.collect`."""

from __future__ import annotations

from pathlib import Path

import typer


def collect_command(
    env: str | None = typer.Argument(
        None,
        metavar="ENV",
        show_default=False,
        help="Dataset to collect from, as --dataset takes it (a registry name, a task folder); with "
        "--base-url, one the server serves. OpenEnv's ENV.",
    ),
    base_url: str | None = typer.Option(
        None,
        "--base-url",
        help="A running harbor serve to collect from (its trace store keeps the sessions); default: "
        "one started in this process. Its agents must reach the teacher: the scripted and anthropic "
        "teachers are served on this machine's 127.0.0.1, and --provider openai without --llm-url uses "
        "the server's own engine.",
    ),
    output_dir: Path = typer.Option(
        Path("sft"), "--output-dir", "-o", help="Folder for results.jsonl and metadata.json."
    ),
    dataset: list[str] = typer.Option(
        [],
        "--dataset",
        help="Task dataset (repeatable, added to ENV). Default: the built-in white-box tasks with --provider "
        "scripted, else builtin; with --base-url, every dataset the server serves.",
    ),
    harness: str = typer.Option("env-factory", "--harness", help="Harness that runs the teacher."),
    sandbox: str | None = typer.Option(
        None, "--sandbox", help="local, docker or e2b (default: local; with --base-url, the server's)."
    ),
    provider: str = typer.Option(
        "openai",
        "--provider",
        help="scripted (no model: a script per built-in environment), openai (any OpenAI-compatible "
        "--llm-url) or anthropic (Anthropic's Messages API; --llm-url overrides its base URL).",
    ),
    llm_url: str | None = typer.Option(
        None, "--llm-url", help="Teacher's base URL: OpenAI-compatible (…/v1), or Anthropic's for anthropic."
    ),
    model: str | None = typer.Option(None, "--model", help="Teacher model name."),
    llm_api_key: str | None = typer.Option(
        None,
        "--llm-api-key",
        envvar="HARBOR_LLM_API_KEY",
        help="Key sent to the teacher, never to an agent (anthropic: default ANTHROPIC_API_KEY, API_KEY).",
    ),
    num_episodes: int | None = typer.Option(
        None,
        "--num-episodes",
        "-n",
        min=1,
        help="Episodes; episode i runs task i % tasks (default: one per task).",
    ),
    prefix: str = typer.Option(
        "episode",
        "--prefix",
        "--episode-id-prefix",
        help="Episode ids are <prefix>-<6 digits> (OpenEnv's name too).",
    ),
    max_concurrent: int = typer.Option(4, "--max-concurrent", min=1, help="Episodes running at once."),
    task: list[str] = typer.Option(
        [], "--task", help="Only tasks whose id matches this (an id or an fnmatch pattern). Repeatable."
    ),
    keep_all: bool = typer.Option(
        False,
        "--keep-all",
        "--keep-losses",
        help="Keep every episode, losses and unscored ones too, not only reward >= --min-reward "
        "(--keep-losses: OpenEnv's name).",
    ),
    min_reward: float = typer.Option(0.0, "--min-reward", help="Keep episodes with reward >= this."),
    reward_key: str | None = typer.Option(
        None,
        "--reward-key",
        help="The verifier metric that is an episode's reward (default: the task's, `reward`, or the only "
        "one). Every metric is kept in verify_metrics either way.",
    ),
    agent_timeout_sec: float | None = typer.Option(
        None,
        "--agent-timeout-sec",
        help="Agent limit in seconds (default: each task's \\[agent] timeout_sec).",
    ),
    agent_step_limit: int = typer.Option(
        0, "--agent-step-limit", min=0, help="Most model calls per episode; 0 = no limit."
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", min=0.0, help="Sampling temperature (default: the agent's own)."
    ),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", min=1, help="Most completion tokens per model call (default: the agent's own)."
    ),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Refuse the run when any task cannot be loaded (default: list them, run the rest).",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue an existing output, skipping ids already there."
    ),
    store: str | None = typer.Option(
        None,
        "--store",
        help="Trace store URL (default: <output dir>/traces.db; open it with harbor inspect --store). Not with "
        "--base-url: the server keeps its own.",
    ),
    push_to_hub: str | None = typer.Option(
        None, "--push-to-hub", help="Upload to this Hub dataset repo (HF_TOKEN)."
    ),
    private: bool = typer.Option(False, "--private", help="Create the Hub repo as private."),
) -> None:
    """The same rollouts as harbor eval, written as results.jsonl + metadata.json for SFT.

    OpenEnv's form works as written: harbor collect ENV [--base-url URL] -o DIR -n N --provider P.

    Exits 1 when every episode of the run errored (no reward at all), and names the errors."""
    import os

    from rich.console import Console

    from evaluation.collect import CollectConfig, run_collect
    from harbor_rl import interrupts
    from harbor_rl.commands.eval import sampling_of

    console = Console(stderr=True)
    dataset = [env, *dataset] if env is not None else list(dataset)
    if not dataset and base_url is None:
        dataset = ["env-tasks"] if provider == "scripted" else ["builtin"]
    if sandbox == "e2b" and base_url is None:  # the in-process server opens no tunnel (harbor serve does)
        raise typer.BadParameter(
            "E2B sandboxes reach the capture port only at a public URL, which the in-process server has "
            "none of: start `harbor serve --sandbox e2b --expose cloudflare` (or --expose direct --public-url "
            "URL) and pass its URL as --base-url",
            param_hint="--sandbox e2b",
        )
    # A ValidationError or an EvaluationError is one line through the CLI layer (harbor_rl.cli).
    config = CollectConfig(
        datasets=dataset,
        harness=harness,
        sandbox=sandbox,
        provider=provider,
        llm_url=llm_url,
        model=model,
        base_url=base_url,
        num_episodes=num_episodes,
        prefix=prefix,
        n_concurrent=max_concurrent,
        task_globs=task,
        keep_losses=keep_all,
        min_reward=min_reward,
        reward_key=reward_key,
        agent_timeout_sec=agent_timeout_sec,
        agent_step_limit=agent_step_limit,
        sampling=sampling_of(temperature, max_tokens),
    )
    try:  # a Ctrl-C cancels the run: live episodes are cancelled, written ones stay in results.jsonl
        summary = interrupts.run(
            run_collect(
                config,
                out_dir=output_dir,
                resume=resume,
                store_url=store,
                llm_api_key=llm_api_key,
                console=console,
                strict=strict,
            )
        )
    except KeyboardInterrupt:
        interrupts.note(f"episodes written so far are kept; continue with: {interrupts.resume_command()}")
        raise
    console.print(
        f"{summary.written} episodes in {output_dir / 'results.jsonl'} ({summary.dropped} dropped by should_keep, "
        f"{summary.errors} unscoreable this run)"
    )
    if summary.metrics_only and not keep_all:
        console.print(
            f"{summary.metrics_only} episode(s) report several metrics and no one reward, so --min-reward "
            "cannot keep them: give --reward-key (or --keep-all)"
        )
    if summary.ran and summary.errors == summary.ran:
        console.print(
            f"[bold red]harbor collect:[/] all {summary.ran} episodes of this run errored (no reward)"
        )
        raise typer.Exit(1)
    if push_to_hub is not None:
        from evaluation.hub import push_to_hub as push

        url = push(output_dir, push_to_hub, token=os.environ.get("HF_TOKEN"), private=private)
        console.print(f"pushed to {url}")


def register(app: typer.Typer) -> None:
    app.command("collect")(collect_command)
