"""The start-up engine probe and `harbor serve` itself (a real subprocess): an unreachable or wrong
engine is reported at start-up, not as mysterious rollout failures.

The healthy engine is `engine.imitation`'s imitation of vLLM's HTTP server (vLLM needs a GPU).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from harbor_server.embedded import free_port
from harbor_server.engine_check import probe_engine

pytestmark = pytest.mark.timeout(120)
MODEL = "imitation-model"


@pytest.fixture
def imitation():
    with serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL))) as url:
        yield url


async def test_probe_of_a_vllm_like_engine(imitation):
    status = await probe_engine(imitation + "/v1", MODEL)
    assert status.reachable and status.token_ids and status.logprobs
    assert status.errors == [] and status.ok
    assert status.models == [MODEL]


@pytest.mark.parametrize(("mode", "processed"), [("processed_logprobs", True), ("raw_logprobs", False)])
async def test_probe_tells_processed_from_raw_logprobs(imitation, mode, processed):
    """The verdict comes from how the top alternatives' gaps move between two temperatures."""
    httpx.post(f"{imitation}/imitation/settings", json={"logprobs_mode": mode}).raise_for_status()
    status = await probe_engine(imitation + "/v1", MODEL)
    assert status.ok and status.processed_logprobs is processed
    if processed:
        assert status.warnings == []
    else:
        assert len(status.warnings) == 1 and "reports raw logprobs" in status.warnings[0]
        assert "--logprobs-mode processed_logprobs" in status.warnings[0]


@pytest.mark.parametrize(
    ("tops", "verdict", "words"),
    [
        ([{"a": -0.1, "b": -2.1}, {"a": -0.01, "b": -4.01}], True, None),  # gap 2 -> 4: processed
        ([{"a": -0.1, "b": -2.1}, {"a": -0.1, "b": -2.1}], False, "reports raw logprobs"),
        ([{"a": -0.1, "b": -2.1}], None, "no top_logprobs at two temperatures"),
        ([{"a": -0.1, "b": -2.1}, {"a": -0.1, "c": -2.1}], None, "fewer than 2 alternatives"),
        ([{"a": -0.693, "b": -0.694}, {"a": -0.693, "b": -0.695}], None, "only 0.001 apart"),
        ([{"a": -0.1, "b": -2.1}, {"a": -0.1, "b": -3.1}], None, "gap ratio 1.50"),
    ],
)
def test_processed_verdict_from_gap_ratios(tops, verdict, words):
    """An engine that lists no alternatives, or too close ones, still serves training: a warning, no verdict."""
    from harbor_server.engine_check import _judge_processed
    from harbor_server.models import EngineStatus

    status = EngineStatus(url="http://engine/v1", checked=True)
    _judge_processed(tops, "http://engine/v1", status)
    assert status.processed_logprobs is verdict and status.errors == []
    if words is None:
        assert status.warnings == []
    else:
        assert len(status.warnings) == 1 and words in status.warnings[0], status.warnings


async def test_probe_reports_an_unreachable_engine():
    url = f"http://127.0.0.1:{free_port()}/v1"
    status = await probe_engine(url, MODEL, timeout_s=2)
    assert not status.reachable and not status.ok
    assert "unreachable" in status.errors[0] and url in status.errors[0]


async def test_probe_reports_a_model_the_engine_does_not_serve(imitation):
    status = await probe_engine(imitation + "/v1", "other-model")
    assert status.reachable and not status.ok
    assert "does not serve model 'other-model'" in status.errors[0]


@pytest.mark.parametrize(
    ("failure", "words"),
    [("no_token_ids", "no prompt_token_ids/token_ids"), ("no_logprobs", "no sampled logprobs")],
)
async def test_probe_reports_an_engine_in_the_wrong_mode(imitation, failure, words):
    """An engine that ignores return_token_ids (older vLLM) or logprobs cannot be trained with."""
    httpx.post(f"{imitation}/imitation/settings", json={"fail": failure}).raise_for_status()
    status = await probe_engine(imitation + "/v1", MODEL)
    assert status.reachable and not status.ok
    assert any(words in e for e in status.errors), status.errors


def _serve_cmd(tmp_path, llm_url: str, *extra: str) -> tuple[list[str], int]:
    port = free_port()
    cmd = [
        sys.executable, "-c", "from harbor_rl.cli import app; app()", "serve", "--dataset", "builtin", "--llm-url", llm_url,
        "--model", MODEL, "--port", str(port), "--capture-port", str(free_port()), "--capture-host", "127.0.0.1",
        "--sandbox", "local", "--store", f"sqlite:///{tmp_path}/traces.db", *extra,
    ]  # fmt: skip
    return cmd, port


def _run_until_ready(cmd: list[str], port: int, tmp_path) -> tuple[subprocess.Popen, str]:
    env = os.environ | {"HARBOR_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "200"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, ""
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            return proc, proc.stderr.read()
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError("harbor serve did not come up")


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def test_serve_reports_an_unreachable_engine_at_start_up(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    cmd, port = _serve_cmd(tmp_path, dead)
    proc, _ = _run_until_ready(cmd, port, tmp_path)
    try:
        engine = httpx.get(f"http://127.0.0.1:{port}/info").json()["engine"]
        assert engine["checked"] and not engine["reachable"]
        assert "unreachable" in engine["errors"][0]
    finally:
        output = _stop(proc)
    assert "engine error:" in output and "unreachable" in output
    assert "datasets" in output and "builtin" in output


def test_serve_with_require_engine_refuses_to_start(tmp_path):
    cmd, port = _serve_cmd(tmp_path, f"http://127.0.0.1:{free_port()}/v1", "--require-engine")
    proc, output = _run_until_ready(cmd, port, tmp_path)
    if proc.poll() is None:
        _stop(proc)
        pytest.fail("harbor serve started although the engine is unreachable")
    assert proc.returncode == 1
    assert "cannot start" in output and "unreachable" in output


def test_serve_summary_with_a_healthy_engine(tmp_path, imitation):
    cmd, port = _serve_cmd(tmp_path, imitation)
    proc, _ = _run_until_ready(cmd, port, tmp_path)
    try:
        info = httpx.get(f"http://127.0.0.1:{port}/info").json()
        assert info["engine"]["reachable"] and info["engine"]["errors"] == []
        assert info["engine"]["token_ids"] and info["engine"]["logprobs"]
    finally:
        output = _stop(proc)
    assert "engine error" not in output
    assert "trainer API" in output and "capture port" in output


def test_sigterm_records_live_rollouts_and_removes_their_sandboxes(tmp_path):
    """A graceful stop leaves nothing running: live rollouts are cancelled, recorded, their sandboxes gone."""
    from capture_proxy.store import TraceStore

    cmd, port = _serve_cmd(tmp_path, f"http://127.0.0.1:{free_port()}/v1", "--skip-engine-check")
    proc, _ = _run_until_ready(cmd, port, tmp_path)
    body = {"split": "builtin", "task_index": 0, "harness": "oracle"}
    started = httpx.post(f"http://127.0.0.1:{port}/rollouts", json=body, timeout=30)
    assert started.status_code == 201, started.text
    _stop(proc)
    assert proc.returncode == 0
    store = TraceStore(f"sqlite:///{tmp_path}/traces.db")
    try:
        record = store.get_session(started.json()["rollout_id"])
    finally:
        store.close()
    assert record.status in ("cancelled", "completed")  # the oracle may finish before the signal lands
    if record.status == "cancelled":
        assert record.error == "the server shut down during this rollout"
    sandboxes = tmp_path / "runs" / "tmp" / "sandboxes"
    assert not sandboxes.exists() or list(sandboxes.iterdir()) == []
