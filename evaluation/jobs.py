"""The jobs folder of `harbor eval`, in Harbor's layout (harbor 0.26.0) so that `harbor view` and Harbor's
models read it; every Harbor file also holds harbor-rl's own record under the key `harbor_rl`.

    DIR/<job>/config.json          Harbor's JobConfig; `harbor_rl`: the job's id and EvalConfig (checked on --resume)
    DIR/<job>/result.json          Harbor's JobResult (stats per agent, model and split); `harbor_rl`: JobSummary,
                                   rewritten at the end of every run
    DIR/<job>/<task>__<7 chars>/   one trial, named as Harbor names them (the 7 characters derive from split,
                                   task and attempt, so a resumed job finds the folder again)
        config.json                Harbor's TrialConfig, written when the trial starts
        result.json                Harbor's TrialResult; `harbor_rl`: TrialResult. Written once, when it ended
        agent/trajectory.json      the captured model calls in ATIF (`capture_proxy.atif`)
        agent/<harness>.txt        the tail of the agent's log
        verifier/                  test-stdout.txt (the tail of the verifier's output), reward.json (its metrics)
        artifacts/                 the task's artifacts, with Harbor's manifest.json
        steps/<step>/verifier/     the same, per step of a `[[steps]]` task
        exception.txt              why the trial has no metrics, when it has none
    DIR/<job>/traces.db            the capture sessions (unless --store names another store)

A job folder of the earlier layout (config.json holding the EvalConfig alone, trials in
`trials/<split>/<task>__<n>/result.json`) is still read: summarised, compared and resumed, its new trials
written in this layout.

Every result file is written to a temporary name and renamed, so a run killed at any moment leaves each
file either whole or absent; a trial whose result.json exists is finished and `--resume` skips it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from evaluation import harbor_format as hf
from evaluation.errors import JobConfigMismatch, JobNotFound
from evaluation.metrics import ks_for, mean_and_se, metric_means, score
from evaluation.models import EvalConfig, JobSummary, StepSummary, TokenCounts, TrialResult

CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
OWN_KEY = "harbor_rl"
"""The key of harbor-rl's own record in each of Harbor's files."""
LEGACY_TRIALS_DIR = "trials"
"""Where the earlier layout kept trials: trials/<split>/<task>__<n>/result.json."""
STORE_FILE = "traces.db"


def write_json_atomic(path: Path, value: Any, *, sort_keys: bool = True) -> None:
    """Write `value` as indented JSON to `path` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    option = orjson.OPT_INDENT_2 | (orjson.OPT_SORT_KEYS if sort_keys else 0)
    data = orjson.dumps(value, option=option) + b"\n"
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


class JobFile(BaseModel):
    """harbor-rl's part of a job's config.json."""

    job_id: uuid.UUID
    """The job's id in Harbor's files (JobResult.id, each TrialConfig.job_id)."""
    created_at: float
    eval: EvalConfig


class Job:
    """One job folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._file: JobFile | None = None

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
        return self.root / hf.trial_name(split, task_id, attempt)

    @classmethod
    def open(cls, root: Path) -> Job:
        job = cls(root)
        if not job.config_path.is_file():
            raise JobNotFound(f"{root} is not a harbor eval job: it has no {CONFIG_FILE}")
        return job

    @classmethod
    def create_or_resume(
        cls, root: Path, config: EvalConfig, *, resume: bool, tasks: Sequence[hf.TaskConfig] = ()
    ) -> Job:
        """A new job folder for `config`, or (resume) the existing one after checking it asks the same.
        `tasks`: the task folders the job plans, for Harbor's JobConfig."""
        job = cls(root)
        if job.config_path.exists():
            if not resume:
                raise JobConfigMismatch(
                    f"job folder {root} already exists; pass --resume to continue it or choose another --job-name"
                )
            stored = job.file()
            if stored.eval.identity() != config.identity():
                diff = {
                    k: (stored.eval.identity().get(k), v)
                    for k, v in config.identity().items()
                    if stored.eval.identity().get(k) != v
                }
                raise JobConfigMismatch(
                    f"cannot resume {root}: its config.json differs in "
                    + ", ".join(f"{k} (stored {a!r}, now {b!r})" for k, (a, b) in diff.items())
                )
            file = stored.model_copy(update={"eval": config})
        elif resume and root.exists() and any(root.iterdir()):
            raise JobNotFound(f"cannot resume {root}: it has no {CONFIG_FILE}")
        else:
            file = JobFile(job_id=uuid.uuid4(), created_at=time.time(), eval=config)
        harbor = hf.job_config(config, root, list(tasks)).model_dump(mode="json")
        write_json_atomic(job.config_path, harbor | {OWN_KEY: file.model_dump(mode="json")}, sort_keys=False)
        job._file = file
        return job

    def file(self) -> JobFile:
        """harbor-rl's part of config.json (a config.json of the earlier layout is the EvalConfig alone)."""
        if self._file is not None:
            return self._file
        try:
            doc = orjson.loads(self.config_path.read_bytes())
        except FileNotFoundError:
            raise JobNotFound(f"{self.root} has no {CONFIG_FILE}") from None
        except orjson.JSONDecodeError as exc:
            raise JobConfigMismatch(f"{self.config_path} is not JSON: {exc}") from exc
        try:
            if isinstance(doc, dict) and OWN_KEY in doc:
                self._file = JobFile.model_validate(doc[OWN_KEY])
            else:
                self._file = JobFile(
                    job_id=uuid.uuid5(uuid.NAMESPACE_URL, self.root.resolve().as_uri()),
                    created_at=self.config_path.stat().st_mtime,
                    eval=EvalConfig.model_validate(doc),
                )
        except ValidationError as exc:
            raise JobConfigMismatch(f"{self.config_path} is not a valid eval config: {exc}") from exc
        return self._file

    def config(self) -> EvalConfig:
        return self.file().eval

    def begin_trial(self, split: str, task_id: str, attempt: int, task_path: str) -> Path:
        """A clean folder for a trial about to run (what an earlier, unfinished run of it left is
        removed, as Harbor does on a retry), with Harbor's TrialConfig in it."""
        trial_dir = self.trial_dir(split, task_id, attempt)
        if trial_dir.exists():
            shutil.rmtree(trial_dir)
        doc = hf.trial_config(self.config(), split, task_path, trial_dir, self.file().job_id)
        write_json_atomic(trial_dir / CONFIG_FILE, doc.model_dump(mode="json"), sort_keys=False)
        return trial_dir

    def write_trial(self, result: TrialResult) -> Path:
        """The trial's result.json (Harbor's TrialResult with ours under `harbor_rl`), and its config.json
        and exception.txt; result.json last, because it marks the trial finished."""
        trial_dir = self.trial_dir(result.split, result.task_id, result.attempt)
        harbor = self._harbor_trial(result, trial_dir)
        write_json_atomic(trial_dir / CONFIG_FILE, harbor.config.model_dump(mode="json"), sort_keys=False)
        if harbor.exception_info is not None:
            (trial_dir / "exception.txt").write_text(harbor.exception_info.exception_message + "\n")
        path = trial_dir / RESULT_FILE
        doc = harbor.document() | {OWN_KEY: result.model_dump(mode="json")}
        write_json_atomic(path, doc, sort_keys=False)
        return path

    def _harbor_trial(self, result: TrialResult, trial_dir: Path) -> hf.HarborTrialResult:
        return hf.trial_document(self.config(), result, trial_dir, self.file().job_id)

    def _trial_files(self) -> list[tuple[Path, TrialResult]]:
        """Every finished trial with its folder, both layouts (a partial file cannot exist: writes are
        atomic; a result.json without our record is not one of ours and is skipped)."""
        found = []
        for path in sorted(self.root.glob(f"*/{RESULT_FILE}")):
            doc = orjson.loads(path.read_bytes())
            if isinstance(doc, dict) and OWN_KEY in doc:
                found.append((path.parent, TrialResult.model_validate(doc[OWN_KEY])))
        for path in sorted((self.root / LEGACY_TRIALS_DIR).glob(f"*/*/{RESULT_FILE}")):
            found.append((path.parent, TrialResult.model_validate_json(path.read_bytes())))
        return found

    def trials(self) -> list[TrialResult]:
        return [result for _, result in self._trial_files()]

    def finished_keys(self) -> set[tuple[str, str, int]]:
        """Trials --resume skips: every one with a result, except those the server never ran (`runner`)."""
        return {(t.split, t.task_id, t.attempt) for t in self.trials() if t.error_kind != "runner"}

    def summary(self) -> JobSummary:
        """The summary the last run wrote (JobNotFound before any run ended)."""
        try:
            doc = orjson.loads(self.result_path.read_bytes())
        except FileNotFoundError:
            raise JobNotFound(f"{self.root} has no {RESULT_FILE} yet: no run of it has ended") from None
        return JobSummary.model_validate(doc.get(OWN_KEY, doc))

    def previous_wall_time(self) -> float:
        if not self.result_path.exists():
            return 0.0
        doc = orjson.loads(self.result_path.read_bytes())
        return float(doc.get(OWN_KEY, doc).get("wall_time_s", 0.0))

    def summarize(self, *, planned_trials: int, started_at: float, wall_time_s: float) -> JobSummary:
        """Score the finished trials and write result.json: Harbor's JobResult, our summary in it."""
        config = self.config()
        found = sorted(self._trial_files(), key=lambda f: (f[1].split, f[1].task_id, f[1].attempt))
        trials = [t for _, t in found]
        summary = summarize_trials(config, trials, job_name=self.name, planned_trials=planned_trials)
        summary = summary.model_copy(
            update={
                "started_at": started_at,
                "finished_at": time.time(),
                "wall_time_s": round(wall_time_s, 3),
            }
        )
        harbor = hf.HarborJobResult(
            id=self.file().job_id,
            started_at=hf.utc(self.file().created_at),
            updated_at=hf.utc(summary.finished_at),
            finished_at=hf.utc(summary.finished_at) if summary.complete else None,
            n_total_trials=planned_trials,
            stats=hf.job_stats([self._harbor_trial(t, d) for d, t in found], planned_trials),
        )
        doc = harbor.model_dump(mode="json") | {OWN_KEY: summary.model_dump(mode="json")}
        write_json_atomic(self.result_path, doc, sort_keys=False)
        return summary


def summarize_trials(
    config: EvalConfig, trials: list[TrialResult], *, job_name: str, planned_trials: int
) -> JobSummary:
    """The summary of a job's finished trials (its run times left 0 for the caller to fill)."""
    groups: dict[str, list[TrialResult]] = defaultdict(list)
    for t in trials:
        groups[f"{t.split}/{t.task_id}"].append(t)
    # A `scored` trial (several metrics, none chosen) is neither a pass, a fail nor an error: not scored here.
    by_task = {task: [t.reward for t in group if t.outcome != "scored"] for task, group in groups.items()}
    scores = score(by_task, ks_for(config.attempts), config.pass_threshold).model_copy(
        update={"trials": len(trials), "metrics_only": sum(t.outcome == "scored" for t in trials)}
    )
    tokens = TokenCounts(
        prompt=sum(t.tokens.prompt for t in trials), completion=sum(t.tokens.completion for t in trials)
    )
    return JobSummary(
        job_name=job_name,
        harness=config.harness,
        model=config.model,
        datasets=config.datasets,
        attempts=config.attempts,
        started_at=0.0,
        finished_at=0.0,
        wall_time_s=0.0,
        complete=len(trials) >= planned_trials,
        planned_trials=planned_trials,
        reward_key=config.reward_key,
        scores=scores,
        metrics=metric_means(t.rewards for t in trials if t.scored),
        outcomes=dict(Counter(t.outcome for t in trials)),
        errors_by_kind=dict(Counter(t.error_kind for t in trials if t.error_kind is not None)),
        errors_by_message=error_messages(trials),
        timed_out=sum(t.timed_out for t in trials),
        tokens={"prompt": tokens.prompt, "completion": tokens.completion, "total": tokens.total},
        model_calls=sum(t.model_calls for t in trials),
        tool_calls=sum(t.tool_calls for t in trials),
        tool_failures=sum(t.tool_failures for t in trials),
        per_task={task: task_row(group) for task, group in groups.items()},
        steps=step_summaries(trials),
    )


def task_row(trials: list[TrialResult]) -> dict[str, Any]:
    """One task's line of the summary: counts by outcome, each trial's reward, each metric's mean."""
    counts = Counter(t.outcome for t in trials)
    return {
        "trials": len(trials),
        "passed": counts["pass"],
        "failed": counts["fail"],
        "metrics_only": counts["scored"],
        "errors": counts["error"],
        "rewards": [t.reward for t in trials],
        "metrics": {k: m.mean for k, m in metric_means(t.rewards for t in trials if t.scored).items()},
        # The public images its trials ran on stand-ins of (docker/stand-ins): scores that may differ.
        "stand_ins": sorted({s.name for t in trials for s in t.stand_in_images}),
    }


def step_summaries(trials: list[TrialResult]) -> dict[str, StepSummary]:
    """Per step name, over the trials that ran it: how many verified or failed, mean reward and metrics."""
    runs: dict[str, list] = {}
    for trial in trials:
        for step in trial.steps:
            runs.setdefault(step.name, []).append(step)
    summaries = {}
    for name, steps in runs.items():
        verified = [s for s in steps if s.error is None and s.rewards]
        summaries[name] = StepSummary(
            trials=len(steps),
            verified=len(verified),
            errors=sum(s.error is not None for s in steps),
            mean_reward=mean_and_se([s.reward for s in steps if s.reward is not None and s.error is None])[0],
            metrics=metric_means(s.rewards for s in verified),
        )
    return summaries


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
