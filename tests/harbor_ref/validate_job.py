"""Runs in Harbor's own venv (not ours): load a job folder the way Harbor's tools do and print, as one JSON
object, everything that fails. Argument: the job folder (or `--trajectory FILE`: that one file only).

- `harbor view`'s scanner (`harbor/viewer/scanner.py`) must find the job, its config, result and every
  trial; and Harbor's models load each file with errors surfacing (JobConfig, JobResult, TrialConfig,
  TrialResult; every artifacts/manifest.json entry, a step's too, as an ArtifactManifestEntry);
- `harbor view`'s own app (`harbor/viewer/server.py` create_app) answers 200 for the job, its trials
  and each trial's result, trajectory and verifier output;
- every agent/trajectory.json loads as an ATIF `Trajectory` and passes `TrajectoryValidator`;
- the job's stats equal what Harbor computes from the trials it loaded: `JobStats.from_trial_results`,
  the default `Mean` metric over the reward-valid trials, and `compute_pass_at_k_by_evals` (harbor/job.py).
"""

import json
import math
import sys
import warnings
from pathlib import Path

from harbor.metrics.mean import Mean
from harbor.models.job.config import JobConfig
from harbor.models.job.result import JobResult, JobStats
from harbor.models.trajectories import Trajectory
from harbor.models.trial.artifact_manifest import ArtifactManifestEntry
from harbor.models.trial.config import TrialConfig
from harbor.models.trial.result import TrialResult
from harbor.utils.pass_at_k import compute_pass_at_k_by_evals
from harbor.utils.trajectory_validator import TrajectoryValidator
from harbor.viewer.scanner import JobScanner


def close(a, b) -> bool:
    """Equal JSON values, floats to 1e-9, lists of names in any order."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        if all(isinstance(x, str) for x in a + b):
            return sorted(a) == sorted(b)
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def harbor_stats(trials: list[TrialResult], n_total: int) -> JobStats:
    """The stats Harbor's own job computes at its end from these trials."""
    stats = JobStats.from_trial_results(trials, n_total_trials=n_total)
    valid: dict[str, list] = {}
    for trial in trials:
        if trial.reward_valid and trial.verifier_result is not None:
            key = JobStats.format_agent_evals_key(
                trial.agent_info.name,
                trial.agent_info.model_info.name if trial.agent_info.model_info else None,
                trial.source or "adhoc",
            )
            valid.setdefault(key, []).append(trial.verifier_result.rewards)
    for key, rewards in valid.items():
        stats.evals[key].metrics.append(Mean().compute(rewards))
    for key, at_k in compute_pass_at_k_by_evals(trials).items():
        stats.evals[key].pass_at_k = at_k
    return stats


def trajectory_errors(path: Path) -> list[str]:
    try:
        Trajectory.model_validate_json(path.read_text())
    except Exception as exc:
        return [f"{type(exc).__name__}: {exc}"]
    validator = TrajectoryValidator()
    return [] if validator.validate(path) else list(validator.get_errors())


def viewer_errors(job_dir: Path, names: list[str]) -> list[str]:
    """The routes `harbor view` calls to show a job and its trials, on its own app."""
    from fastapi.testclient import TestClient
    from harbor.viewer.server import create_app

    client = TestClient(create_app(job_dir.parent, mode="jobs"))
    job = job_dir.name
    routes = ["/api/jobs", f"/api/jobs/{job}", f"/api/jobs/{job}/config", f"/api/jobs/{job}/trials"]
    for name in names:
        routes += [f"/api/jobs/{job}/trials/{name}", f"/api/jobs/{job}/trials/{name}/verifier-output"]
        if (job_dir / name / "agent" / "trajectory.json").exists():
            routes.append(f"/api/jobs/{job}/trials/{name}/trajectory")
    errors = []
    for route in routes:
        response = client.get(route)
        if response.status_code != 200:
            errors.append(f"harbor view GET {route}: {response.status_code} {response.text[:300]}")
    listed = {item["name"] for item in client.get(f"/api/jobs/{job}/trials").json().get("items", [])}
    if listed != set(names):
        errors.append(f"harbor view lists trials {sorted(listed)}, the folder holds {sorted(names)}")
    return errors


def main() -> None:
    if sys.argv[1] == "--trajectory":
        print(json.dumps({"errors": trajectory_errors(Path(sys.argv[2]))}))
        return
    job_dir = Path(sys.argv[1]).resolve()
    errors: list[str] = []
    scanner = JobScanner(job_dir.parent)
    if job_dir.name not in scanner.list_jobs():
        errors.append("the viewer's scanner does not list the job")
    for name, load in (("config.json", JobConfig), ("result.json", JobResult)):
        try:
            load.model_validate_json((job_dir / name).read_text())
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    if scanner.get_job_config(job_dir.name) is None or scanner.get_job_result(job_dir.name) is None:
        errors.append("the viewer's scanner cannot read the job's config.json or result.json")
    trials: list[TrialResult] = []
    report = {"trials": 0, "trajectories": 0, "agent_steps": 0, "steps_with_token_ids": 0,
              "steps_with_tool_calls": 0, "observations": 0, "manifests": 0}  # fmt: skip
    names = scanner.list_trials(job_dir.name)
    for name in names:
        trial_dir = job_dir / name
        try:
            TrialConfig.model_validate_json((trial_dir / "config.json").read_text())
            trials.append(TrialResult.model_validate_json((trial_dir / "result.json").read_text()))
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if scanner.get_trial_result(job_dir.name, name) is None:
            errors.append(f"{name}: the viewer's scanner cannot read its result.json")
        path = trial_dir / "agent" / "trajectory.json"
        if path.exists():
            report["trajectories"] += 1
            found = trajectory_errors(path)
            errors.extend(f"{name}/agent/trajectory.json: {e}" for e in found)
            if not found:
                trajectory = Trajectory.model_validate_json(path.read_text())
                agent = [s for s in trajectory.steps if s.source == "agent"]
                report["agent_steps"] += len(agent)
                report["steps_with_token_ids"] += sum(
                    bool(s.metrics and s.metrics.completion_token_ids and s.metrics.logprobs) for s in agent
                )
                report["steps_with_tool_calls"] += sum(bool(s.tool_calls) for s in agent)
                report["observations"] += sum(len(s.observation.results) for s in agent if s.observation)
        for manifest in [
            trial_dir / "artifacts" / "manifest.json",
            *trial_dir.glob("steps/*/artifacts/manifest.json"),
        ]:
            if not manifest.exists():
                continue
            report["manifests"] += 1
            try:
                for entry in json.loads(manifest.read_text()):
                    ArtifactManifestEntry.model_validate(entry)
            except Exception as exc:
                errors.append(f"{manifest.relative_to(job_dir)}: {type(exc).__name__}: {exc}")
    report["trials"] = len(trials)
    errors.extend(viewer_errors(job_dir, names))
    try:
        stored = JobResult.model_validate_json((job_dir / "result.json").read_text())
    except Exception:
        stored = None  # reported above
    if stored is not None:
        ours = stored.stats.model_dump(mode="json")
        theirs = harbor_stats(trials, stored.n_total_trials).model_dump(mode="json")
        for key in sorted(ours.keys() | theirs.keys()):
            if not close(ours.get(key), theirs.get(key)):
                errors.append(
                    f"result.json stats.{key}: ours {ours.get(key)!r}, Harbor's {theirs.get(key)!r}"
                )
        report["evals"] = ours["evals"]
    report["errors"] = errors
    print(json.dumps(report))


if __name__ == "__main__":
    warnings.simplefilter("ignore", DeprecationWarning)
    main()
