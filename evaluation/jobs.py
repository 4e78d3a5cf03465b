"""The jobs folder of `harbor eval`: one folder per job, one result.json per trial, a summary.

    DIR/<job>/config.json                      what was asked (checked again on --resume)
    DIR/<job>/trials/<split>/<task>__<n>/result.json   one trial (written once, when it ended)
    DIR/<job>/result.json                      the job's summary (rewritten at the end of every run)
    DIR/<job>/traces.db                        the capture sessions (unless --store names another store)

Every file is written to a temporary name and renamed, so a run killed at any moment leaves each
file either whole or absent; a trial whose result.json exists is finished and `--resume` skips it.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capture_proxy.models import SamplingParams
from evaluation.errors import JobConfigMismatch, JobNotFound
from evaluation.metrics import DEFAULT_PASS_THRESHOLD, Scores, ks_for, score

CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
TRIALS_DIR = "trials"
STORE_FILE = "traces.db"

Outcome = Literal["pass", "fail", "error"]
ErrorKind = Literal["verifier", "model_call", "harness", "sandbox", "cancelled", "timeout", "runner", "other"]


def write_json_atomic(path: Path, value: Any) -> None:
    """Write `value` as indented JSON to `path` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def job_store_url(folder: Path) -> str:
    """The trace store a job keeps by default: `<folder>/traces.db` (open it with `harbor inspect --store`).

    Not the shared default store: a starting server marks every session still `running` in its store
    as failed (a crash's leftovers), which would hit a `harbor serve` running on the shared one.
    """
    return f"sqlite:///{folder.resolve() / STORE_FILE}"


def safe_name(text: str) -> str:
    """`text` usable as one path component."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "_"


class EvalConfig(BaseModel):
    """Everything one `harbor eval` job runs; stored as the job's config.json."""

    model_config = ConfigDict(extra="forbid")

    datasets: list[str] = Field(default_factory=lambda: ["builtin"])
    """Dataset specs (builtin, a folder of tasks, hf:REPO[@split]); each is a split."""
    harness: str
    sandbox: str = "local"
    llm_url: str | None = None
    """The engine's OpenAI base URL (any OpenAI-compatible API); None only for nop/oracle."""
    model: str | None = None
    attempts: int = Field(default=1, ge=1)
    """Trials per task (the k of pass@k)."""
    n_concurrent: int = Field(default=4, ge=1)
    """Trials running at once."""
    task_globs: list[str] = Field(default_factory=list)
    """fnmatch patterns on task ids; empty runs every task."""
    agent_timeout_sec: float | None = Field(default=None, gt=0)
    """Agent wall-clock limit in seconds; None uses each task's [agent] timeout_sec."""
    agent_step_limit: int = Field(default=0, ge=0)
    """Most model calls per trial; 0 means no limit."""
    sampling: SamplingParams | None = None
    """Sampling sent with the session; None lets the agent's own sampling pass through."""
    pass_threshold: float = DEFAULT_PASS_THRESHOLD
    """A trial passes when its reward is at least this."""

    def identity(self) -> dict[str, Any]:
        """The fields a resumed job must share with the stored one (concurrency may change)."""
        return self.model_dump(mode="json", exclude={"n_concurrent"})


class TokenCounts(BaseModel):
    prompt: int = 0
    completion: int = 0

    @property
    def total(self) -> int:
        return self.prompt + self.completion


class TrialResult(BaseModel):
    """One trial: a task run once by the harness, then verified."""

    trial_id: str
    split: str
    task_id: str
    attempt: int
    rollout_id: str | None = None
    """The capture session's id: open it in the trace inspector."""
    status: str
    """completed | failed | timed_out | cancelled (the rollout's status)."""
    outcome: Outcome
    reward: float | None = None
    """None = an error (unscoreable), never a failure."""
    rewards: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    error_kind: ErrorKind | None = None
    timed_out: bool = False
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds per phase (sandbox_start, agent, verifier, sandbox_stop, total)."""
    started_at: float
    finished_at: float
    model_calls: int = 0
    tokens: TokenCounts = Field(default_factory=TokenCounts)
    tool_calls_by_name: dict[str, int] = Field(default_factory=dict)
    tool_failures: int = 0

    @property
    def tool_calls(self) -> int:
        return sum(self.tool_calls_by_name.values())


def classify_error(status: str, reward: float | None, error: str | None, timed_out: bool) -> ErrorKind | None:
    """Why a trial has no reward (None when it has one). Matches the server's error texts."""
    if reward is not None:
        return None
    text = (error or "").lower()
    if status == "cancelled":
        return "cancelled"
    if "verifier gave no reward" in text:
        return "verifier"
    if "model call failed" in text:
        return "model_call"
    if text.startswith("harness"):
        return "harness"
    if text.startswith("sandbox"):
        return "sandbox"
    if timed_out or status == "timed_out":
        return "timeout"
    return "other"


class JobSummary(BaseModel):
    """The job's result.json."""

    job_name: str
    harness: str
    model: str | None
    datasets: list[str]
    attempts: int
    started_at: float
    finished_at: float
    wall_time_s: float
    """Seconds across every run of this job (resumed runs add up)."""
    complete: bool
    """Every planned trial has a result."""
    planned_trials: int
    scores: Scores
    outcomes: dict[str, int]
    errors_by_kind: dict[str, int]
    errors_by_message: dict[str, int] = Field(default_factory=dict)
    """`kind: first line of the error` -> trials, so a summary says what went wrong, not only where."""
    timed_out: int
    tokens: dict[str, int]
    model_calls: int
    tool_calls: int
    tool_failures: int
    per_task: dict[str, dict[str, Any]]


class Job:
    """One job folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def server_id(self) -> str:
        """The in-process server's owner name in the store, the same in every run of this job folder."""
        digest = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]
        return f"harbor-eval:{safe_name(self.name)[:100]}:{digest}"

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def result_path(self) -> Path:
        return self.root / RESULT_FILE

    def trial_dir(self, split: str, task_id: str, attempt: int) -> Path:
        return self.root / TRIALS_DIR / safe_name(split) / f"{safe_name(task_id)}__{attempt}"

    @classmethod
    def open(cls, root: Path) -> Job:
        job = cls(root)
        if not job.config_path.is_file():
            raise JobNotFound(f"{root} is not a harbor eval job: it has no {CONFIG_FILE}")
        return job

    @classmethod
    def create_or_resume(cls, root: Path, config: EvalConfig, *, resume: bool) -> Job:
        """A new job folder for `config`, or (resume) the existing one after checking it asks the same."""
        job = cls(root)
        if job.config_path.exists():
            if not resume:
                raise JobConfigMismatch(
                    f"job folder {root} already exists; pass --resume to continue it or choose another --job-name"
                )
            stored = job.config()
            if stored.identity() != config.identity():
                diff = {
                    k: (stored.identity()[k], v)
                    for k, v in config.identity().items()
                    if stored.identity()[k] != v
                }
                raise JobConfigMismatch(
                    f"cannot resume {root}: its config.json differs in "
                    + ", ".join(f"{k} (stored {a!r}, now {b!r})" for k, (a, b) in diff.items())
                )
        elif resume and root.exists() and any(root.iterdir()):
            raise JobNotFound(f"cannot resume {root}: it has no {CONFIG_FILE}")
        write_json_atomic(job.config_path, config.model_dump(mode="json"))
        return job

    def config(self) -> EvalConfig:
        try:
            return EvalConfig.model_validate_json(self.config_path.read_bytes())
        except FileNotFoundError:
            raise JobNotFound(f"{self.root} has no {CONFIG_FILE}") from None
        except ValidationError as exc:
            raise JobConfigMismatch(f"{self.config_path} is not a valid eval config: {exc}") from exc

    def write_trial(self, result: TrialResult) -> Path:
        path = self.trial_dir(result.split, result.task_id, result.attempt) / RESULT_FILE
        write_json_atomic(path, result.model_dump(mode="json"))
        return path

    def trials(self) -> list[TrialResult]:
        """Every finished trial (a partial or foreign file cannot exist: writes are atomic)."""
        results = []
        for path in sorted((self.root / TRIALS_DIR).glob(f"*/*/{RESULT_FILE}")):
            results.append(TrialResult.model_validate_json(path.read_bytes()))
        return results

    def finished_keys(self) -> set[tuple[str, str, int]]:
        """Trials --resume skips: every one with a result, except those the server never ran (`runner`)."""
        return {(t.split, t.task_id, t.attempt) for t in self.trials() if t.error_kind != "runner"}

    def previous_wall_time(self) -> float:
        if not self.result_path.exists():
            return 0.0
        return float(orjson.loads(self.result_path.read_bytes()).get("wall_time_s", 0.0))

    def summarize(self, *, planned_trials: int, started_at: float, wall_time_s: float) -> JobSummary:
        config = self.config()
        trials = self.trials()
        by_task: dict[str, list[float | None]] = defaultdict(list)
        for t in trials:
            by_task[f"{t.split}/{t.task_id}"].append(t.reward)
        scores = score(by_task, ks_for(config.attempts), config.pass_threshold)
        per_task: dict[str, dict[str, Any]] = {}
        for t in sorted(trials, key=lambda t: (t.split, t.task_id, t.attempt)):
            row = per_task.setdefault(
                f"{t.split}/{t.task_id}", {"trials": 0, "passed": 0, "failed": 0, "errors": 0, "rewards": []}
            )
            row["trials"] += 1
            row[{"pass": "passed", "fail": "failed", "error": "errors"}[t.outcome]] += 1
            row["rewards"].append(t.reward)
        tokens = TokenCounts(
            prompt=sum(t.tokens.prompt for t in trials), completion=sum(t.tokens.completion for t in trials)
        )
        summary = JobSummary(
            job_name=self.name,
            harness=config.harness,
            model=config.model,
            datasets=config.datasets,
            attempts=config.attempts,
            started_at=started_at,
            finished_at=time.time(),
            wall_time_s=round(wall_time_s, 3),
            complete=len(trials) >= planned_trials,
            planned_trials=planned_trials,
            scores=scores,
            outcomes=dict(Counter(t.outcome for t in trials)),
            errors_by_kind=dict(Counter(t.error_kind for t in trials if t.error_kind is not None)),
            errors_by_message=error_messages(trials),
            timed_out=sum(t.timed_out for t in trials),
            tokens={"prompt": tokens.prompt, "completion": tokens.completion, "total": tokens.total},
            model_calls=sum(t.model_calls for t in trials),
            tool_calls=sum(t.tool_calls for t in trials),
            tool_failures=sum(t.tool_failures for t in trials),
            per_task=per_task,
        )
        write_json_atomic(self.result_path, summary.model_dump(mode="json"))
        return summary


ERROR_TEXT_CHARS = 300


def error_line(kind: str | None, error: str | None) -> str:
    """`kind: the error's first line`, cut to ERROR_TEXT_CHARS: how distinct errors are counted."""
    first = next((line.strip() for line in (error or "").splitlines() if line.strip()), "no message")
    text = f"{kind or 'other'}: {first}"
    return text if len(text) <= ERROR_TEXT_CHARS else text[: ERROR_TEXT_CHARS - 1] + "…"


def error_messages(trials: list[TrialResult]) -> dict[str, int]:
    """Each distinct error of the trials without a reward, with how many trials had it, most first."""
    counts = Counter(error_line(t.error_kind, t.error) for t in trials if t.outcome == "error")
    return dict(counts.most_common())


def latest_job(jobs_dir: Path) -> Path:
    """The most recently created job folder in `jobs_dir` (for --resume without --job-name)."""
    candidates = [p.parent for p in jobs_dir.glob(f"*/{CONFIG_FILE}")]
    if not candidates:
        raise JobNotFound(f"no harbor eval job in {jobs_dir} to resume; give --job-name")
    return max(candidates, key=lambda p: (p / CONFIG_FILE).stat().st_mtime)
