"""Evaluate agents and collect SFT data, on the same server, harnesses, sandboxes and proxy; no trainer.

    from evaluation import EvalConfig, run_eval, CollectConfig, run_collect
    summary = await run_eval(EvalConfig(harness="oracle"), jobs_dir=Path("jobs"))
    summary.scores.pass_rate, summary.scores.pass_at_k          # 1.0, {"1": 1.0}
    await run_collect(CollectConfig(provider="scripted", datasets=["env-tasks"]), out_dir=Path("sft"))

`metrics` holds the estimators, `models` the job's records, `jobs` the jobs folder (Harbor's layout, with
`harbor_format` Harbor's documents and `trial_folder` a trial's files), `runner` the eval loop, `compare`
the diff of two jobs, `collect` the SFT dataset writer, `scripted` the model-free teacher, `hub` the Hub
upload.
"""

from evaluation.collect import CollectConfig, Episode, run_collect, should_keep
from evaluation.errors import (
    DatasetMisaligned,
    EvaluationError,
    JobConfigMismatch,
    JobNotFound,
    MissingEngine,
    NoTasksSelected,
    ProviderError,
    UnknownChoice,
)
from evaluation.jobs import Job
from evaluation.metrics import Scores, mean_and_se, pass_at_k, score
from evaluation.models import EvalConfig, JobSummary, TrialResult
from evaluation.runner import run_eval

__all__ = [
    "CollectConfig",
    "Episode",
    "DatasetMisaligned",
    "EvalConfig",
    "EvaluationError",
    "Job",
    "JobConfigMismatch",
    "JobNotFound",
    "MissingEngine",
    "JobSummary",
    "NoTasksSelected",
    "ProviderError",
    "Scores",
    "TrialResult",
    "UnknownChoice",
    "mean_and_se",
    "pass_at_k",
    "run_collect",
    "run_eval",
    "score",
    "should_keep",
]
