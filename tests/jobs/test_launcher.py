"""The launcher that runs on the job, with real local processes: the embedded engine (`harbor engine`,
standing in for vLLM, which needs a GPU) and a real `harbor serve`, started in that order, each healthy
before the next; then the main process; then everything stopped in reverse order. Failures name the
process and show its log tail."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from harbor_rl.jobs import (
    LauncherError,
    ProcessFailedError,
    ProcessSpec,
    build_plan,
    load_run_config,
    run_plan,
)
from harbor_rl.jobs.launcher import Stopped, stop_on_sigterm
from harbor_server.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys, httpx
engine, server, out = sys.argv[1:4]
seen = {"engine": httpx.get(engine + "/health").status_code,
        "models": [m["id"] for m in httpx.get(engine + "/v1/models").json()["data"]],
        "server": httpx.get(server + "/health").status_code,
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "e2b_key_visible": "E2B_API_KEY" in os.environ}
open(out, "w").write(json.dumps(seen))
"""


@pytest.fixture(autouse=True)
def harbor_on_path(monkeypatch):
    # The `harbor` children must import this checkout whatever the installed copy points at.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def embedded_config(tmp_path: Path):
    return load_run_config({
        "run_name": "launcher-test", "model": "tiny", "engine": {"kind": "embedded", "port": free_port(),
        "health_timeout_s": 240}, "sandbox": "local", "port": free_port(), "capture_port": free_port(),
        "work_dir": str(tmp_path / "job"), "num_gpus": 3, "server_health_timeout_s": 240,
    })  # fmt: skip


def http_health_spec(name: str, folder: Path, *, timeout_s: float = 60.0, health: bool = True) -> ProcessSpec:
    """A real HTTP server that answers GET /health with 200 (or 404 when `health` is False)."""
    folder.mkdir(parents=True, exist_ok=True)
    if health:
        (folder / "health").write_text("ok")
    port = free_port()
    serve = shlex.join(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)]
    )
    return ProcessSpec(
        name=name,
        argv=["sh", "-c", f"echo $$ > {shlex.quote(str(folder / 'pid'))}; exec {serve}"],
        health_url=f"http://127.0.0.1:{port}/health",
        health_timeout_s=timeout_s,
    )


def sleeper(name: str = "trainer") -> ProcessSpec:
    return ProcessSpec(name=name, argv=[sys.executable, "-c", "import time; time.sleep(120)"])


def test_engine_then_server_then_trainer_then_stopped_in_reverse(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", "e2b_must_not_reach_the_trainer")
    config = embedded_config(tmp_path)
    plan = build_plan(config, model_path="tiny", public_url=None)
    assert [p.name for p in plan] == ["engine", "server", "trainer"]
    assert plan[0].argv[:2] == ["harbor", "engine"] and plan[1].argv[:2] == ["harbor", "serve"]
    assert plan[2].argv[:2] == ["harbor", "train"] and "--server-url" in plan[2].argv
    # The real trainer needs minutes; this stand-in records what it finds when the launcher starts it.
    seen_file = tmp_path / "seen.json"
    plan[2] = replace(
        plan[2], argv=[sys.executable, "-c", PROBE, config.engine_url, config.server_url, str(seen_file)]
    )
    events: list[str] = []

    code = run_plan(plan, tmp_path / "logs", echo=False, grace_s=20, poll_s=0.2, on_event=events.append)

    assert code == 0
    assert [e.split(" ")[0] + " " + e.split(" ")[1].rstrip(":") for e in events] == [
        "start engine", "healthy engine", "start server", "healthy server", "start trainer",
        "exit trainer", "stop trainer", "stop server", "stop engine",
    ]  # fmt: skip
    seen = json.loads(seen_file.read_text())
    assert seen == {"engine": 200, "models": ["tiny"], "server": 200, "cuda": "1,2", "e2b_key_visible": False}
    for url in (config.engine_url, config.server_url):  # both were stopped
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=2)
    assert "Uvicorn running" in (tmp_path / "logs" / "engine.log").read_text()  # each child has its log


def test_a_failing_engine_is_named_with_its_log_tail_and_nothing_else_starts(tmp_path) -> None:
    config = embedded_config(tmp_path)
    plan = build_plan(config, model_path=str(tmp_path / "no-such-model"), public_url=None)
    events: list[str] = []
    with pytest.raises(ProcessFailedError) as caught:
        run_plan(plan, tmp_path / "logs", echo=False, grace_s=5, poll_s=0.2, on_event=events.append)
    error = caught.value
    assert error.name == "engine"
    assert str(error).startswith("engine exited with code 2 before it was healthy at http://127.0.0.1:")
    assert "is neither 'tiny' nor a local Hugging Face model folder" in error.log_tail
    assert [e.split(" ")[0] for e in events] == ["start", "stop"]


def test_an_engine_that_never_gets_healthy_fails_at_its_deadline(tmp_path) -> None:
    engine = http_health_spec("engine", tmp_path / "www", timeout_s=1.5, health=False)  # GET /health: 404
    with pytest.raises(
        ProcessFailedError, match=r"engine was not healthy at http://127.0.0.1:\d+/health after 2 s"
    ) as caught:
        run_plan(
            [engine, sleeper()], tmp_path / "logs", echo=False, grace_s=5, poll_s=0.2, on_event=lambda _: None
        )
    assert '"GET /health HTTP/1.1" 404' in caught.value.log_tail


def test_a_helper_that_dies_during_training_stops_the_run(tmp_path) -> None:
    engine = http_health_spec("engine", tmp_path / "www")
    events: list[str] = []

    def kill_engine_once_training() -> None:
        for _ in range(600):
            if any(e.startswith("start trainer") for e in events):
                os.kill(int((tmp_path / "www" / "pid").read_text()), signal.SIGKILL)
                return
            threading.Event().wait(0.1)

    killer = threading.Thread(target=kill_engine_once_training, daemon=True)
    killer.start()
    with pytest.raises(ProcessFailedError, match="engine exited with code -9 while trainer was running"):
        run_plan(
            [engine, sleeper()], tmp_path / "logs", echo=False, grace_s=5, poll_s=0.2, on_event=events.append
        )
    killer.join(5)
    assert [e.split(" ")[1] for e in events if e.startswith("stop")] == ["trainer", "engine"]


def test_sigterm_stops_every_child(tmp_path) -> None:
    engine = http_health_spec("engine", tmp_path / "www")
    previous = signal.getsignal(signal.SIGTERM)
    events: list[str] = []
    stop_on_sigterm()
    timer = threading.Timer(0.1, lambda: None)
    try:

        def on_event(event: str) -> None:
            events.append(event)
            if event.startswith("start trainer"):  # a cancelled job: the platform sends SIGTERM
                timer.function = lambda: os.kill(os.getpid(), signal.SIGTERM)
                timer.start()

        with pytest.raises(Stopped, match="received signal 15"):
            run_plan(
                [engine, sleeper()], tmp_path / "logs", echo=False, grace_s=5, poll_s=0.2, on_event=on_event
            )
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert [e.split(" ")[1] for e in events if e.startswith("stop")] == ["trainer", "engine"]
    with pytest.raises(httpx.HTTPError):
        httpx.get(engine.health_url or "", timeout=2)


def test_the_last_process_must_be_the_main_one(tmp_path) -> None:
    with pytest.raises(LauncherError, match="last process must be the main one"):
        run_plan([http_health_spec("engine", tmp_path / "www")], tmp_path / "logs", echo=False)
