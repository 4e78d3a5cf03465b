"""`harbor eval`: score an agent (harness + model) on task datasets, or compare two jobs."""

from __future__ import annotations

from pathlib import Path

import typer


def eval_command(
    dataset: list[str] = typer.Option(
        ["builtin"],
        "--dataset",
        help="Task dataset: builtin, a folder of tasks, or hf:REPO\\[@split]. Repeatable.",
    ),
    harness: str | None = typer.Option(
        None, "--harness", help="nop, oracle, mini-swe-agent, opencode, env-factory."
    ),
    sandbox: str = typer.Option("local", "--sandbox", help="local, docker or e2b."),
    llm_url: str | None = typer.Option(
        None, "--llm-url", help="OpenAI-compatible base URL of the model (not needed for nop/oracle)."
    ),
    model: str | None = typer.Option(None, "--model", help="Model name sent to the endpoint."),
    llm_api_key: str | None = typer.Option(
        None,
        "--llm-api-key",
        envvar="HARBOR_LLM_API_KEY",
        help="Key sent to the endpoint (never to an agent).",
    ),
    attempts: int = typer.Option(1, "-k", "--attempts", min=1, help="Trials per task (the k of pass@k)."),
    n_concurrent: int = typer.Option(4, "--n-concurrent", min=1, help="Trials running at once."),
    task_glob: list[str] = typer.Option(
        [], "--task-glob", help="Run only tasks whose id matches. Repeatable."
    ),
    jobs_dir: Path = typer.Option(Path("jobs"), "--jobs-dir", help="Folder holding one folder per job."),
    job_name: str | None = typer.Option(
        None, "--job-name", help="Job folder name (default: time + harness)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the job (--job-name, else the latest one), skipping finished trials.",
    ),
    agent_timeout: float | None = typer.Option(
        None, "--agent-timeout", help="Agent limit in seconds (default: each task's [agent] timeout_sec)."
    ),
    step_limit: int = typer.Option(
        0, "--step-limit", min=0, help="Most model calls per trial; 0 = no limit."
    ),
    pass_threshold: float = typer.Option(1.0, "--pass-threshold", help="A trial passes at reward >= this."),
    store: str | None = typer.Option(
        None,
        "--store",
        help="Trace store URL (default: <job folder>/traces.db; open it with harbor inspect --store).",
    ),
    compare: tuple[Path, Path] | None = typer.Option(
        None, "--compare", help="Print the tasks whose outcome changed between two job folders, then exit."
    ),
) -> None:
    """Run every task k times through a harness against any OpenAI-compatible endpoint; write a jobs folder."""
    import asyncio

    from pydantic import ValidationError
    from rich.console import Console

    from evaluation.errors import EvaluationError
    from evaluation.jobs import EvalConfig
    from harbor_server.errors import HarborServerError
    from tasks.errors import TaskError

    console = Console(stderr=True)
    if compare is not None:
        _compare(*compare)
        return
    if harness is None:
        raise typer.BadParameter("give --harness (or --compare JOB1 JOB2)", param_hint="--harness")
    try:
        config = EvalConfig(
            datasets=dataset,
            harness=harness,
            sandbox=sandbox,
            llm_url=llm_url,
            model=model,
            attempts=attempts,
            n_concurrent=n_concurrent,
            task_globs=task_glob,
            agent_timeout_sec=agent_timeout,
            agent_step_limit=step_limit,
            pass_threshold=pass_threshold,
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from exc
    from evaluation.runner import run_eval

    try:
        summary = asyncio.run(
            run_eval(
                config,
                jobs_dir=jobs_dir,
                job_name=job_name,
                resume=resume,
                store_url=store,
                llm_api_key=llm_api_key,
                console=console,
            )
        )
    except (EvaluationError, HarborServerError, TaskError, ValueError) as exc:
        console.print(f"[bold red]harbor eval:[/] {exc}")
        raise typer.Exit(1) from None
    typer.echo(str(jobs_dir / summary.job_name / "result.json"))


def _compare(first: Path, second: Path) -> None:
    from rich.console import Console

    from evaluation.compare import compare_jobs, comparison_table
    from evaluation.errors import EvaluationError

    try:
        changes = compare_jobs(first, second)
    except EvaluationError as exc:
        Console(stderr=True).print(f"[bold red]harbor eval --compare:[/] {exc}")
        raise typer.Exit(1) from None
    Console().print(comparison_table(first, second, changes))


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
