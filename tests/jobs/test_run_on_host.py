"""`harbor jobs run-on-host` end to end, as a job runs it, on CPU: the embedded engine stands in for
vLLM (no GPU here), then a real `harbor serve` (local sandbox, the built-in white-box tasks), then the real
`harbor train` with the command line the launcher builds, one GRPO step with a gloo weight sync."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harbor_server.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_run_on_host_trains_one_step_through_its_own_engine_and_server(tmp_path) -> None:
    config = {
        "run_name": "run-on-host-test", "model": "tiny", "engine": {"kind": "embedded", "port": free_port()},
        "sandbox": "local", "harness": "env-factory", "dataset": ["env-tasks"], "port": free_port(),
        "capture_port": free_port(), "work_dir": str(tmp_path / "job"), "num_gpus": 1,
        "trainer": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 2,
                    "max_concurrent_rollouts": 2, "max_completion_length": 16, "eval_episodes": 0,
                    "report_to": "jsonl", "tasks": ["echo-hi"]},
    }  # fmt: skip
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    done = subprocess.run(
        ["harbor", "jobs", "run-on-host", "--config-json", json.dumps(config)],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    launcher = [line.split(" ")[1] + " " + line.split(" ")[2].rstrip(":") for line in done.stdout.splitlines()
                if line.startswith("[launcher] ")]  # fmt: skip
    assert launcher == [
        "start engine", "healthy engine", "start server", "healthy server", "start trainer",
        "exit trainer", "stop trainer", "stop server", "stop engine",
    ]  # fmt: skip
    assert "[trainer] " in done.stdout and "[server] " in done.stdout  # each child's output, prefixed
    (step,) = [
        json.loads(line) for line in (tmp_path / "job" / "out" / "metrics.jsonl").read_text().splitlines()
    ]
    assert step["step"] == 1 and step["rollout/failed"] == 0
    assert step["policy_version"] == 2  # the initial push, then the step's: weights reached the engine
    assert {p.name for p in (tmp_path / "job" / "logs").iterdir()} == {
        "engine.log",
        "server.log",
        "trainer.log",
    }
