"""`harbor eval --compare JOB1 JOB2`: the tasks whose outcome changed between two jobs.

A task's outcome in a job is its pass rate over the trials that passed or failed (errors, and trials of
several metrics with none chosen as the reward, left out); a task with none of those has no pass rate. A change is any difference, labelled `fixed` (now passes more often),
`broke` (less often), or `appeared` / `vanished` / `now errors` / `now scored`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from pydantic import BaseModel
from rich.table import Table

from evaluation.jobs import Job


class TaskChange(BaseModel):
    task: str
    before: float | None
    """Pass rate in the first job; None when the task has no scored trial there."""
    after: float | None
    before_trials: int
    after_trials: int
    change: str


def outcome_counts(job: Job) -> dict[str, Counter[str]]:
    """Per `split/task`: how many of its trials ended in each outcome (pass, fail, error, ...)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for trial in job.trials():
        counts[f"{trial.split}/{trial.task_id}"][trial.outcome] += 1
    return dict(counts)


def pass_rates(job: Job) -> tuple[dict[str, float | None], dict[str, int]]:
    """Per `split/task`: pass rate over passed and failed trials (None if none) and trial count."""
    rates: dict[str, float | None] = {}
    totals: dict[str, int] = {}
    for task, seen in outcome_counts(job).items():
        judged = seen["pass"] + seen["fail"]
        rates[task] = seen["pass"] / judged if judged else None
        totals[task] = seen.total()
    return rates, totals


def _label(before: float | None, after: float | None, in_before: bool, in_after: bool) -> str | None:
    if not in_before:
        return "appeared"
    if not in_after:
        return "vanished"
    if before == after:
        return None
    if before is None:
        return "now scored"
    if after is None:
        return "now errors"
    return "fixed" if after > before else "broke"


def compare_jobs(first: Path, second: Path) -> list[TaskChange]:
    """The tasks whose outcome differs between the jobs at `first` and `second`, sorted by task."""
    rates_a, counts_a = pass_rates(Job.open(first))
    rates_b, counts_b = pass_rates(Job.open(second))
    changes = []
    for task in sorted(set(rates_a) | set(rates_b)):
        before, after = rates_a.get(task), rates_b.get(task)
        label = _label(before, after, task in rates_a, task in rates_b)
        if label is not None:
            changes.append(
                TaskChange(
                    task=task,
                    before=before,
                    after=after,
                    before_trials=counts_a.get(task, 0),
                    after_trials=counts_b.get(task, 0),
                    change=label,
                )
            )
    return changes


def comparison_table(first: Path, second: Path, changes: list[TaskChange]) -> Table:
    table = Table(title=f"{first.name} -> {second.name}: {len(changes)} task(s) changed")
    for column in ("task", f"pass rate {first.name}", f"pass rate {second.name}", "change"):
        table.add_column(column)
    styles = {"fixed": "green", "broke": "red"}
    for c in changes:
        fmt = [("-" if v is None else f"{v:.2f}") for v in (c.before, c.after)]
        table.add_row(
            c.task,
            f"{fmt[0]} ({c.before_trials})",
            f"{fmt[1]} ({c.after_trials})",
            c.change,
            style=styles.get(c.change),
        )
    return table
