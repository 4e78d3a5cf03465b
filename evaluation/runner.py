"""`harbor eval`: every selected task, `attempts` times, through a harness, verified; no training.

    config = EvalConfig(datasets=["builtin"], harness="oracle", attempts=2)
    summary = await run_eval(config, jobs_dir=Path("jobs"), job_name="oracle-check")

Trials run `n_concurrent` at a time on an in-process Harbor server (see `evaluation.rollouts`); each
one's result.json is written the moment it ends, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evaluation.errors import NoTasksSelected
from evaluation.harbor_format import TaskConfig
from evaluation.jobs import Job, job_store_url, latest_job
from evaluation.models import (
    EvalConfig,
    JobSummary,
    StandInImage,
    TokenCounts,
    TrialResult,
    chosen_reward,
    classify_error,
    is_scored,
    outcome_of,
)
from evaluation.rollouts import LocalHarbor, RolloutOutcome, check_choices, engine_for, token_counts
from evaluation.trial_folder import write_trial_outputs
from harbor_server import RolloutRequest
from harbor_server.server import refuse_unisolated
from tasks import Dataset, Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trial:
    split: str
    task_id: str
    attempt: int

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.split, self.task_id, self.attempt)


def load_datasets(specs: list[str], *, strict: bool = False) -> dict[str, Dataset]:
    """The `--dataset` specs as splits; a task that cannot be loaded is listed in its dataset's `refused`
    (`strict`: the whole dataset is refused instead)."""
    import harbor_server

    return harbor_server.load_datasets(specs, strict=strict)


def print_refused(console: Console, datasets: Mapping[str, Dataset], globs: list[str]) -> int:
    """One line per refused task the run would have taken (all, without `--task` patterns); how many."""
    count = 0
    for split, dataset in datasets.items():
        for refusal in dataset.refused:
            if globs and not any(fnmatch.fnmatch(refusal.task_id, g) for g in globs):
                continue
            console.print(f"[yellow]refused[/] {split}/{refusal.task_id}: {escape(refusal.reason)}")
            count += 1
    return count


def select_tasks(datasets: Mapping[str, Dataset], globs: list[str]) -> list[tuple[str, str]]:
    """(split, task id) of every task matching any glob (all tasks without globs), in dataset order."""
    selected = [
        (split, task.id)
        for split, dataset in datasets.items()
        for task in dataset
        if not globs or any(fnmatch.fnmatchcase(task.id, g) for g in globs)
    ]
    if not selected:
        available = ", ".join(t.id for d in datasets.values() for t in d)
        raise NoTasksSelected(f"no task matches --task {' '.join(globs)!r}; tasks: {available}")
    return selected


def plan_trials(tasks: list[tuple[str, str]], attempts: int) -> list[Trial]:
    return [Trial(split, task_id, a) for split, task_id in tasks for a in range(attempts)]


@dataclass(frozen=True)
class TaskFacts:
    """What a trial's files say about its task (Harbor's task_name, task_id path, task_checksum)."""

    name: str
    path: str
    checksum: str
    stand_ins: tuple[StandInImage, ...] = ()
    """Its base images that are stand-ins in this Docker engine (`stand_in_images`)."""

    @classmethod
    def of(cls, task: Task, sandbox: str = "local", *, force_build: bool = False) -> TaskFacts:
        stand_ins = tuple(stand_in_images(task, force_build=force_build)) if sandbox == "docker" else ()
        return cls(name=task.name, path=str(task.paths.root), checksum=task.digest(), stand_ins=stand_ins)

    def fields(self) -> dict[str, Any]:
        return {
            "task_name": self.name,
            "task_path": self.path,
            "task_checksum": self.checksum,
            "stand_in_images": list(self.stand_ins),
        }


def stand_in_images(task: Task, *, force_build: bool = False) -> list[StandInImage]:
    """The images the task's sandbox and its separate verifier's are built from (or are) that are stand-ins
    in the local Docker engine, where `LocalHarbor`'s docker sandboxes run (none when the engine cannot be
    reached: the trial then says why itself)."""
    from sandboxes.images import base_image_names, stand_ins_among
    from tasks.verifier_env import verifier_environment, verifier_spec

    try:
        import docker

        specs = [task.sandbox_spec("stand-in-check", force_build=force_build)]
        specs += [
            verifier_spec(task, step, "stand-in-check", force_build=force_build)[0]
            for step in task.steps or (None,)
            if verifier_environment(task, step) is not None
        ]
        names = list(dict.fromkeys(name for spec in specs for name in base_image_names(spec)))
        client = docker.from_env()
        try:
            return [StandInImage(**found) for found in stand_ins_among(client, names)]
        finally:
            client.close()
    except Exception as exc:  # the SDK raises DockerException, requests' errors, ...; a task's env error
        log.debug("could not tell whether %s runs on a stand-in: %s", task.id, exc)
        return []


def trial_result(
    trial: Trial, outcome: RolloutOutcome, started_at: float, config: EvalConfig, task: TaskFacts
) -> TrialResult:
    result = outcome.result
    prompt, completion = token_counts(outcome.turns)
    scored = is_scored(result)
    reward = chosen_reward(result, config.reward_key)
    return TrialResult(
        trial_id=f"{trial.split}/{trial.task_id}/{trial.attempt}",
        split=trial.split,
        task_id=trial.task_id,
        attempt=trial.attempt,
        rollout_id=result.rollout_id,
        status=result.status,
        outcome=outcome_of(scored, reward, config.pass_threshold),
        reward=reward,
        rewards=result.rewards,
        error=result.error,
        error_kind=classify_error(result.status, scored, result.error, result.timed_out),
        timed_out=result.timed_out,
        timings=result.timings,
        started_at=started_at,
        finished_at=time.time(),
        model_calls=len(outcome.turns),
        tokens=TokenCounts(prompt=prompt, completion=completion),
        tool_calls_by_name=result.tool_calls_by_name,
        tool_failures=result.tool_failures,
        steps=result.steps,
        image=result.image,
        **task.fields(),
    )


def runner_error(trial: Trial, exc: Exception, started_at: float, task: TaskFacts) -> TrialResult:
    """A trial the server refused or lost: an error of kind `runner`, with the reason."""
    return TrialResult(
        trial_id=f"{trial.split}/{trial.task_id}/{trial.attempt}",
        split=trial.split,
        task_id=trial.task_id,
        attempt=trial.attempt,
        status="failed",
        outcome="error",
        error=f"{type(exc).__name__}: {exc}",
        error_kind="runner",
        started_at=started_at,
        finished_at=time.time(),
        **task.fields(),
    )


def resolve_job_dir(jobs_dir: Path, job_name: str | None, config: EvalConfig, resume: bool) -> Path:
    if job_name is not None:
        return jobs_dir / job_name
    if resume:
        return latest_job(jobs_dir)
    stamp = time.strftime("%Y-%m-%d__%H-%M-%S")
    return jobs_dir / f"{stamp}__{config.harness}"


async def run_eval(
    config: EvalConfig,
    *,
    jobs_dir: Path,
    job_name: str | None = None,
    resume: bool = False,
    store_url: str | None = None,
    llm_api_key: str | None = None,
    console: Console | None = None,
    datasets: Mapping[str, Dataset] | None = None,
    strict: bool = False,
    expose: str = "none",
    public_url: str | None = None,
) -> JobSummary:
    """Run (or resume) one job; returns its summary, also written to <job>/result.json. A task that
    cannot be loaded is listed and the others run (`strict`: the job is refused instead)."""
    console = console or Console(stderr=True)
    # Everything that can be refused is refused here, before the job folder exists: a typo must not
    # leave a folder that a bare --resume then takes for the latest job.
    check_choices(config.harness, config.sandbox)
    llm_url, model = engine_for(config.harness, config.llm_url, config.model)
    datasets = (
        dict(datasets)
        if datasets is not None
        else await asyncio.to_thread(load_datasets, config.datasets, strict=strict)
    )
    print_refused(console, datasets, config.task_globs)
    selected = select_tasks(datasets, config.task_globs)
    refuse_unisolated(((s, datasets[s].get(t)) for s, t in selected), config.sandbox)
    trials = plan_trials(selected, config.attempts)
    planned = [TaskConfig(path=str(datasets[s].get(t).paths.root), source=s) for s, t in selected]
    job = Job.create_or_resume(
        resolve_job_dir(jobs_dir, job_name, config, resume), config, resume=resume, tasks=planned
    )
    finished = job.finished_keys()
    todo = [t for t in trials if t.key not in finished]
    started_at, t0 = time.time(), time.monotonic()
    previous = job.previous_wall_time()
    console.print(
        f"job [bold]{job.name}[/] in {job.root}: {len(trials)} trials, "
        f"{len(trials) - len(todo)} already finished, {len(todo)} to run"
    )
    if todo:
        async with LocalHarbor(
            datasets,
            sandbox=config.sandbox,
            llm_url=llm_url,
            model=model,
            llm_api_key=llm_api_key,
            store_url=store_url or job_store_url(job.root),
            max_concurrent=config.n_concurrent,
            server_id=job.server_id,
            expose=expose,
            public_url=public_url,
            force_build=config.force_build,
        ) as harbor:
            if harbor.leftovers_marked:
                console.print(
                    f"[yellow]marked {harbor.leftovers_marked} session(s) a killed run of this job left "
                    "running as failed[/]"
                )
            await _run_trials(harbor, job, config, datasets, todo, console)
    summary = job.summarize(
        planned_trials=len(trials), started_at=started_at, wall_time_s=previous + time.monotonic() - t0
    )
    console.print(results_table(summary))
    print_errors(console, summary.errors_by_message)
    console.print(f"traces: harbor inspect --store {store_url or job_store_url(job.root)}")
    return summary


async def _run_trials(
    harbor: LocalHarbor,
    job: Job,
    config: EvalConfig,
    datasets: Mapping[str, Dataset],
    todo: list[Trial],
    console: Console,
) -> None:
    semaphore = asyncio.Semaphore(config.n_concurrent)
    counts = {"pass": 0, "fail": 0, "scored": 0, "error": 0}
    facts: dict[tuple[str, str], TaskFacts] = {}
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "pass {task.fields[passed]}  fail {task.fields[failed]}  metrics {task.fields[scored]}  "
            "error {task.fields[errors]}"
        ),
        TimeElapsedColumn(),
        console=console,
    )

    async def task_facts(trial: Trial) -> TaskFacts:
        key = (trial.split, trial.task_id)
        if key not in facts:  # the digest reads every file of the task: once per task
            task = datasets[trial.split].get(trial.task_id)
            facts[key] = await asyncio.to_thread(TaskFacts.of, task, config.sandbox, force_build=config.force_build)
        return facts[key]

    async def one(trial: Trial, bar) -> None:
        async with semaphore:
            started_at = time.time()
            task, outcome = TaskFacts(name=trial.task_id, path="", checksum=""), None
            trial_dir = job.trial_dir(trial.split, trial.task_id, trial.attempt)
            try:  # one trial's failure is its result, never the job's end
                task = await task_facts(trial)
                job.begin_trial(trial.split, trial.task_id, trial.attempt, task.path)
                outcome = await harbor.run(rollout_request(config, job, trial, trial_dir))
                result = trial_result(trial, outcome, started_at, config, task)
            except Exception as exc:
                result = runner_error(trial, exc, started_at, task)
            if outcome is not None:
                try:
                    await asyncio.to_thread(
                        write_trial_outputs, trial_dir, outcome, harness=config.harness, model=config.model
                    )
                except Exception as exc:  # the files beside result.json never cost the trial its result
                    log.exception("trial %s: could not write its agent/verifier/artifacts files", trial_dir)
                    console.print(
                        f"{trial_dir.name}: its trajectory or artifacts were not written: {exc}", markup=False
                    )
            job.write_trial(result)
            counts[result.outcome] += 1
            progress.update(
                bar,
                advance=1,
                passed=counts["pass"],
                failed=counts["fail"],
                scored=counts["scored"],
                errors=counts["error"],
            )

    with progress:
        bar = progress.add_task(f"{config.harness}", total=len(todo), passed=0, failed=0, scored=0, errors=0)
        await asyncio.gather(*(one(t, bar) for t in todo))


def rollout_request(config: EvalConfig, job: Job, trial: Trial, trial_dir: Path) -> RolloutRequest:
    """The rollout of one trial; the server collects the task's artifacts into the trial's folder
    (`artifacts/`, `steps/<step>/artifacts/`, as Harbor lays a trial out)."""
    sampling = {"sampling": config.sampling} if config.sampling is not None else {}
    return RolloutRequest(
        **sampling,
        split=trial.split,
        task_id=trial.task_id,
        harness=config.harness,
        sandbox=config.sandbox,
        model=config.model,
        llm_url=config.llm_url,
        agent_timeout_sec=config.agent_timeout_sec,
        agent_step_limit=config.agent_step_limit,
        purpose="eval",
        artifacts_dir=str(trial_dir.resolve()),
        seed=trial.attempt,
        episode_id=f"{job.name}/{trial.task_id}/{trial.attempt}",
        metadata={"eval_job": job.name, "attempt": trial.attempt, "run": job.name},
    )


SHOWN_ERRORS = 10


def print_errors(console: Console, counts: Mapping[str, int]) -> None:
    """The distinct errors, most frequent first: `13 x runner: ValueError: ...`."""
    if not counts:
        return
    console.print(f"[bold yellow]{len(counts)} distinct error(s):[/]")
    for text, n in list(counts.items())[:SHOWN_ERRORS]:
        console.print(f"  {n} x {text}", highlight=False, markup=False)
    if len(counts) > SHOWN_ERRORS:
        console.print(f"  ... and {len(counts) - SHOWN_ERRORS} more (result.json: errors_by_message)")


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def results_table(summary: JobSummary) -> Table:
    """The final table: one row per task with one column per metric (as Harbor's CLI prints them), then
    the job's headline numbers in the caption."""
    s = summary.scores
    table = Table(title=f"harbor eval {summary.job_name} ({summary.harness}, {summary.model or 'no model'})")
    table.add_column("task")
    table.add_column("trials", justify="right")
    table.add_column("pass", justify="right", style="green")
    table.add_column("fail", justify="right", style="red")
    if s.metrics_only:
        table.add_column("metrics only", justify="right")
    table.add_column("error", justify="right", style="yellow")
    for key in summary.metrics:
        table.add_column(key, justify="right")
    stand_ins = sorted({name for row in summary.per_task.values() for name in row.get("stand_ins", ())})
    if stand_ins:
        table.add_column("stand-in of", style="magenta")
    for task, row in summary.per_task.items():
        cells = [task, str(row["trials"]), str(row["passed"]), str(row["failed"])]
        cells += [str(row.get("metrics_only", 0))] if s.metrics_only else []
        cells.append(str(row["errors"]))
        cells += [_fmt(row.get("metrics", {}).get(key)) for key in summary.metrics]
        cells += [", ".join(row.get("stand_ins", ())) or "-"] if stand_ins else []
        table.add_row(*cells)
    on = f" on {summary.reward_key!r}" if summary.reward_key else ""
    at_k = "  ".join(f"pass@{k} {_fmt(v)}" for k, v in s.pass_at_k.items())
    se = f" ± {_fmt(s.reward_se)}" if s.reward_se is not None else ""
    means = "  ".join(
        f"{k} {_fmt(m.mean)}" + (f" ± {_fmt(m.se)}" if m.se is not None else "")
        for k, m in summary.metrics.items()
    )
    errors = ", ".join(f"{k} {v}" for k, v in sorted(summary.errors_by_kind.items())) or "none"
    lines = [
        f"pass rate{on} {_fmt(s.pass_rate)} ({s.passed}/{s.scored} with a reward)  {at_k}  "
        f"mean reward {_fmt(s.mean_reward)}{se}",
        f"metrics: {means or 'none'}",
    ]
    if s.metrics_only:
        lines.append(metrics_only_hint(summary))
    if stand_ins:
        lines.append(
            f"ran on stand-ins of {', '.join(stand_ins)}, not the images themselves (which could not be "
            "pulled): scores may differ; docker/stand-ins/README.md says how"
        )
    lines.extend(
        f"step {name}: {st.verified}/{st.trials} verified"
        + "".join(f", {k} {_fmt(m.mean)}" for k, m in st.metrics.items())
        for name, st in summary.steps.items()
    )
    lines.append(
        f"errors: {errors}  tokens {summary.tokens['total']}  wall {summary.wall_time_s:.1f} s"
        + ("" if summary.complete else f"  INCOMPLETE ({s.trials}/{summary.planned_trials} trials)")
    )
    table.caption = "\n".join(lines)
    return table


def metrics_only_hint(summary: JobSummary) -> str:
    """Why some scored trials are in no pass rate or pass@k, and the flag that puts them there."""
    n, keys = summary.scores.metrics_only, ", ".join(summary.metrics)
    if summary.reward_key is not None:
        return f"{n} scored trial(s) report no {summary.reward_key!r}: not in pass rate or pass@k (metrics: {keys})"
    return (
        f"{n} scored trial(s) report several metrics and no `reward`: pass@k needs one, "
        f"give --reward-key (one of: {keys})"
    )
