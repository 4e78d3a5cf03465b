"""What a finished rollout leaves in its trial folder besides result.json, where Harbor keeps the same:
`agent/` (the ATIF trajectory of the captured calls, the agent's log tail), `verifier/` and
`steps/<step>/verifier/` (the verifier's output and metrics), `artifacts/` and `steps/<step>/artifacts/`
(the task's artifacts, with Harbor's manifest.json; the server collects them into the trial's folder).

The server copies /logs/verifier (what test.sh left: reward.txt or reward.json, ...) into the trial folder eval
names, with Harbor's test-stdout.txt (stdout and stderr together). A result with no such folder (a
server elsewhere) gets the tail the server hands back and its metrics as reward.json.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from capture_proxy.atif import Agent, trajectory_from_turns
from evaluation.jobs import safe_name
from evaluation.rollouts import RolloutOutcome

AGENT_VERSION = "unknown"
"""What Harbor writes for an agent that does not tell its version."""


def write_trial_outputs(trial_dir: Path, outcome: RolloutOutcome, *, harness: str, model: str | None) -> None:
    result = outcome.result
    agent_dir = trial_dir / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    agent = Agent(name=harness, version=AGENT_VERSION, model_name=model)
    trajectory = trajectory_from_turns(outcome.turns, agent, session_id=result.rollout_id)
    if trajectory is not None:
        (agent_dir / "trajectory.json").write_bytes(trajectory.to_json() + b"\n")
    if result.agent_log_tail:
        (agent_dir / f"{safe_name(harness)}.txt").write_text(result.agent_log_tail)
    write_verifier_dir(trial_dir / "verifier", result.verifier_output, result.rewards)
    for step in result.steps:
        write_verifier_dir(
            trial_dir / "steps" / step.name / "verifier", step.verifier_output, step.rewards
        )
    if result.artifacts_dir is not None:
        copy_artifacts(Path(result.artifacts_dir), trial_dir)


def write_verifier_dir(folder: Path, output: str, rewards: dict[str, float]) -> None:
    """The verifier's files, unless the server already kept the real ones there (eval asks it to)."""
    if (folder / "test-stdout.txt").is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test-stdout.txt").write_text(output)
    if rewards:
        (folder / "reward.json").write_bytes(orjson.dumps(rewards) + b"\n")


def copy_artifacts(source: Path, trial_dir: Path) -> None:
    """The rollout's artifacts, laid out as in a Harbor trial (`artifacts/`, `steps/<step>/artifacts/`),
    into the trial's folder; nothing to do when the server collected them there, as eval asks it to."""
    if not source.is_dir() or source.resolve() == trial_dir.resolve():
        return
    for folder in [source / "artifacts", *sorted((source / "steps").glob("*/artifacts"))]:
        if folder.is_dir():
            target = trial_dir / folder.relative_to(source)
            shutil.copytree(folder, target, symlinks=True, dirs_exist_ok=True)
