"""The embedded run's engine and Harbor server as processes of their own (harbor_rl.service_process):
they serve, a failed start says why with the end of its log, and neither outlives the process that
started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from harbor_rl.service_process import engine_process, running, server_process
from trainer.errors import TrainerConfigError


def test_the_engine_serves_the_model_and_the_server_its_tasks_until_the_block_ends(tiny_dir, tmp_path) -> None:
    engine = engine_process(tiny_dir, "tiny", max_model_len=512, log_path=tmp_path / "engine.log")
    server = server_process(
        ["env-tasks"], llm_url=engine.url + "/v1", model="tiny", sandbox="local",
        store_url=f"sqlite:///{tmp_path}/traces.db", max_concurrent=3, server_id="test", log_path=tmp_path / "server.log",
    )  # fmt: skip
    with running(engine) as engine_url, running(server) as server_url:
        models = httpx.get(engine_url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 512
        info = httpx.get(server_url + "/info").json()
        assert info["capacity"]["max_concurrent_envs"] == 3 and info["server_id"] == "test"
        assert [d["split"] for d in info["datasets"]] == ["env-tasks"]
    for url in (engine_url, server_url):
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health")


def test_a_failed_start_is_one_error_with_the_end_of_its_log(tmp_path) -> None:
    starting = running(engine_process(tmp_path / "no-model", "tiny", max_model_len=512, log_path=tmp_path / "e.log"))
    with pytest.raises(TrainerConfigError) as info, starting:
        pass
    message = str(info.value)
    assert "the embedded engine exited with 2 while starting" in message and str(tmp_path / "e.log") in message
    assert "no-model" in message  # the engine's own one-line reason, from its log


def test_it_dies_with_the_process_that_started_it(tiny_dir, tmp_path) -> None:
    """A run killed outright (no `finally`) leaves no engine serving behind it."""
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from harbor_rl.service_process import engine_process, running
        with running(engine_process(Path({str(tiny_dir)!r}), "tiny", max_model_len=512,
                                    log_path=Path({str(tmp_path / "e.log")!r}))) as url:
            print(url, flush=True)
            os.kill(os.getpid(), 9)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=os.getcwd())  # fmt: skip
    assert run.returncode == -signal.SIGKILL, run.stderr
    url = run.stdout.strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/health", timeout=1)
        except httpx.TransportError:
            return
        time.sleep(0.2)
    pytest.fail(f"the engine at {url} still answers after its parent was killed")
