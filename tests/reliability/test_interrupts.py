"""Ctrl-C on the long commands, as a terminal sends it: SIGINT to the command's whole process group.

Each command runs as a real subprocess in a session of its own, with a marker in its environment that
every process it starts inherits (the engine, the Harbor server, the sandboxes' processes). After the
signal the command must exit 130 within 10 s with exactly one `interrupted` line and no traceback, and
no process carrying the marker may be left. `harbor train` interrupted during GRPO must have saved the
last finished step, and `--resume` must go on from it; a second Ctrl-C kills at once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from capture_proxy.store import TraceStore
from harbor_server.embedded import free_port
from sandboxes.docker_sandbox import OWNER_LABEL
from tests.reliability.conftest import wait_for
from tests.sandboxes.conftest import docker_client_or_skip

pytestmark = pytest.mark.timeout(300)

HARBOR = [sys.executable, "-m", "harbor_rl"]
"""The CLI of this checkout."""
BOUND_S = 10.0
"""How long a first Ctrl-C may take to end a command (the issue's bound)."""
TINY_TRAIN = {
    # GRPO at once (no warm-up, no evaluation), two rollouts a group, short completions: a step takes
    # well under a second on the tiny model, so the interrupt lands a few steps in.
    "report_to": "jsonl", "sft_steps": 0, "eval_episodes": 0, "max_completion_length": 16,
    "num_generations": 2, "per_device_train_batch_size": 2, "max_concurrent_rollouts": 2, "max_steps": 40,
}  # fmt: skip
WARM_UP = {
    # The embedded default's phases on tiny numbers: demonstrations, SFT and the base evaluation at once.
    **TINY_TRAIN, "sft_steps": 20, "demo_episodes": 2, "base_eval_episodes": 4, "eval_episodes": 2,
}  # fmt: skip


class Command:
    """`harbor ARGS` in its own session, its output in a file (a pipe could fill and stall it)."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.marker = uuid.uuid4().hex
        self.log = tmp_path / f"harbor-{self.marker[:8]}.log"
        environment = os.environ | {"COLUMNS": "200", "HARBOR_INTERRUPT_TEST": self.marker} | (env or {})
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*HARBOR, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=environment, start_new_session=True,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def running(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(
                f"harbor exited with {self.proc.returncode} before the interrupt:\n{self.output()[-3000:]}"
            )
        return True

    def ctrl_c(self, twice_after_s: float | None = None) -> float:
        """SIGINT to the process group, as the terminal sends it (and again after `twice_after_s`);
        returns the seconds until the command exited."""
        started = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        if twice_after_s is not None:
            time.sleep(twice_after_s)
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"still running 60 s after Ctrl-C:\n{self.output()[-3000:]}")
        return time.monotonic() - started

    def left_behind(self) -> list[str]:
        """Processes still carrying this command's marker (its children and theirs)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if self.marker.encode() in (entry / "environ").read_bytes():
                    found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()[:120]!r}")
            except OSError:  # gone meanwhile, or not ours to read
                continue
        return found

    def assert_ended_cleanly(self, seconds: float, line: str = "interrupted;") -> str:
        output = self.output()
        assert self.proc.returncode == 130, output[-3000:]
        assert seconds < BOUND_S, f"took {seconds:.1f} s to stop:\n{output[-3000:]}"
        assert output.count("interrupted") == 1 and line in output, output[-3000:]
        assert "Traceback" not in output, output[-5000:]
        # Sandboxes' processes end with their server (bubblewrap's --die-with-parent): a moment after.
        wait_for(lambda: not self.left_behind(), timeout_s=5, what="no process of the command left")
        return output


def _config(tmp_path: Path, settings: dict) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in settings.items()))
    return path


def _metric_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.is_file() else []


def test_ctrl_c_during_grpo_saves_the_last_step_and_resume_goes_on_from_it(tmp_path) -> None:
    out, config = tmp_path / "out", _config(tmp_path, TINY_TRAIN)
    run = Command(tmp_path, "train", "--config", str(config), "--output-dir", str(out))
    wait_for(lambda: run.running() and len(_metric_steps(out)) >= 2, timeout_s=180, what="two GRPO steps")
    output = run.assert_ended_cleanly(run.ctrl_c())

    saved = re.search(r"GRPO step (\d+) saved in (\S+);", output)
    assert saved, output[-2000:]
    step = int(saved.group(1))
    assert Path(saved.group(2)) == out / f"checkpoint-{step}" and _metric_steps(out) == list(
        range(1, step + 1)
    )
    state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())
    assert state["global_step"] == step
    # The line gives the exact command to go on with: this one, plus --resume.
    assert f"continue with: harbor train --config {config} --output-dir {out} --resume" in output
    assert "weight push" not in output and "ServerUnreachable" not in output

    # One more step from the saved one: the next step is step + 1, with the saved optimizer and schedule
    # (tests/trainer/test_interrupt_resume.py checks those exactly).
    resumed = subprocess.run(
        [*HARBOR, "train", "--config", str(config), "--output-dir", str(out), "--resume",
         "--max-steps", str(step + 1)],
        capture_output=True, text=True, timeout=240, env=os.environ | {"COLUMNS": "200"},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert _metric_steps(out) == list(range(1, step + 2))
    final = json.loads((out / f"checkpoint-{step + 1}" / "trainer_state.json").read_text())
    assert final["global_step"] == step + 1 and final["policy_version"] > state["policy_version"]


def test_ctrl_c_during_the_warm_up_stops_the_engine_the_server_and_the_warm_up(tmp_path) -> None:
    """The issue's case: Ctrl-C during `eval base` killed the engine and server (the terminal's signal
    reached them too) while the trainer went on with SFT for minutes."""
    out = tmp_path / "out"
    run = Command(tmp_path, "train", "--config", str(_config(tmp_path, WARM_UP)), "--output-dir", str(out))
    # The engine and server answer and the base model is being evaluated, while the demonstrations are
    # collected and SFT runs on a thread.
    wait_for(lambda: run.running() and "evaluating base" in run.output(), timeout_s=180,
             what="the warm-up and the base evaluation")  # fmt: skip
    run.assert_ended_cleanly(run.ctrl_c(), "GRPO had not started")


@pytest.mark.parametrize("sandbox", ["local", "docker"])
def test_ctrl_c_on_eval_cancels_live_trials_and_keeps_finished_ones(tmp_path, sandbox) -> None:
    if sandbox == "docker":
        client = docker_client_or_skip()
    jobs = tmp_path / "jobs"
    args = ["eval", "--harness", "oracle", "--dataset", "builtin", "--task", "fix-*", "-k", "4",
            "--max-concurrent", "2", "--sandbox", sandbox, "--output-dir", str(jobs), "--job-name", "cut"]  # fmt: skip
    run = Command(tmp_path, *args)
    wait_for(
        lambda: run.running() and any((jobs / "cut").glob("*/result.json")), timeout_s=180, what="a trial"
    )
    owner = f"{OWNER_LABEL}={run.proc.pid}@{socket.gethostname()}"
    if sandbox == "docker":  # interrupted with a live trial's container running
        wait_for(
            lambda: client.api.containers(filters={"label": owner}), timeout_s=60, what="a live container"
        )
    output = run.assert_ended_cleanly(run.ctrl_c(), "finished trials are kept; continue with: harbor eval")
    assert output.rstrip().endswith("--job-name cut --resume"), output[-500:]
    store = TraceStore(f"sqlite:///{jobs / 'cut' / 'traces.db'}")
    try:  # the live trials were cancelled and recorded so, none left `running`
        assert store.list_sessions(status="running", limit=100) == []
    finally:
        store.close()
    if sandbox == "docker":  # the live trials' containers went with them
        assert client.api.containers(all=True, filters={"label": owner}) == []


def test_ctrl_c_on_collect(tmp_path) -> None:
    out = tmp_path / "demos"
    run = Command(
        tmp_path, "collect", "--provider", "scripted", "-n", "200", "--max-concurrent", "2", "-o", str(out)
    )
    wait_for(lambda: run.running() and (out / "results.jsonl").is_file(), timeout_s=120, what="an episode")
    run.assert_ended_cleanly(run.ctrl_c(), "episodes written so far are kept")


def _serve(tmp_path: Path) -> tuple[Command, list[str], Path]:
    """`harbor serve` with three oracle rollouts under way: the command, their ids, its store."""
    port, capture_port, db = free_port(), free_port(), tmp_path / "traces.db"
    run = Command(
        tmp_path, "serve", "--dataset", "builtin", "--llm-url", f"http://127.0.0.1:{free_port()}/v1",
        "--model", "tiny", "--port", str(port), "--capture-port", str(capture_port), "--store", f"sqlite:///{db}",
        "--skip-engine-check", env={"HARBOR_RUNS_DIR": str(tmp_path / "runs")},
    )  # fmt: skip

    def up() -> bool:
        run.running()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout_s=90, what="harbor serve")
    body = {"split": "builtin", "harness": "oracle"}
    started = [
        httpx.post(f"http://127.0.0.1:{port}/rollouts", json={**body, "task_index": i}, timeout=30).json()[
            "rollout_id"
        ]
        for i in range(3)
    ]
    return run, started, db


def test_ctrl_c_on_serve_cancels_and_records_its_live_rollouts(tmp_path) -> None:
    run, started, db = _serve(tmp_path)
    run.assert_ended_cleanly(run.ctrl_c(), "harbor serve: interrupted; live rollouts cancelled")
    store = TraceStore(f"sqlite:///{db}")
    try:
        statuses = {store.get_session(rollout).status for rollout in started}
    finally:
        store.close()
    assert statuses <= {"cancelled", "completed"}, statuses  # an oracle may finish before the signal lands


def test_a_second_ctrl_c_kills_at_once(tmp_path) -> None:
    """The first Ctrl-C starts the orderly stop (HTTP drained, rollouts cancelled, sandboxes stopped);
    the second ends it there, and the sandboxes' processes die with the server."""
    run, _, _ = _serve(tmp_path)
    time.sleep(0.5)  # the sandboxes' processes are running
    seconds = run.ctrl_c(twice_after_s=0.1)
    output = run.output()
    assert run.proc.returncode == 130 and seconds < 3, (seconds, output[-3000:])
    assert output.count("interrupted again; killed at once") == 1 and "Traceback" not in output, output[
        -3000:
    ]
    wait_for(lambda: not run.left_behind(), timeout_s=5, what="its sandboxes' processes gone with it")


def test_resume_without_a_checkpoint_is_one_line_before_anything_starts(tmp_path) -> None:
    """What an interrupt before GRPO leaves (its line says there is nothing to resume): --resume there is
    refused at once, naming the folder, not after the engine and server have started."""
    from typer.testing import CliRunner

    from harbor_rl.cli import app

    result = CliRunner().invoke(app, ["train", "--resume", "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert f"--resume: {tmp_path / 'out'} holds no checkpoint-<step> folder" in result.output
    assert not (tmp_path / "out" / "engine.log").exists() and "Traceback" not in result.output
