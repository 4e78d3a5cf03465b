"""The real vLLM (its CPU build) for tests/vllm_live, from the venv that `bash scripts/setup.sh --with-vllm`
builds; every test here is skipped, with that command as the reason, when the venv is absent. A start
takes 30-170 s and ~3 GiB, so the tiny model's server (`vllm`) is started once for the folder, and the two
modules that need another (raw logprobs, the scripted tool-call model) start one each beside it: two at
once at most. The end of the run prints each server's start time, memory and the time its tests took."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine import vllm_backend
from engine.errors import VllmNotInstalled, VllmStartError
from engine.tiny_model import build_tiny_model
from harbor_server import free_port

START_TIMEOUT_S = 600.0
RUNNING_URL_ENV = "HARBOR_VLLM_LIVE_URL"
_TIMINGS: list[str] = []


@dataclass
class LiveVllm:
    url: str
    """Base URL, no /v1."""
    model_path: Path
    served_model_name: str
    log_path: Path | None

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


def _group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in vLLM's process group (API server, engine core, worker)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of /proc/PID/stat, counted after the command name
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
    return total


def require_venv() -> None:
    try:
        vllm_backend.vllm_python()
    except VllmNotInstalled as exc:
        pytest.skip(f"live vLLM tests need vLLM's CPU build: {exc}")


@contextlib.contextmanager
def live_vllm(
    model_path: Path, name: str, log_dir: Path, logprobs_mode: str = "processed_logprobs"
) -> Iterator[LiveVllm]:
    """vLLM serving `model_path` as `name` until the block ends; its log in `log_dir`/vllm.log."""
    require_venv()
    launch = vllm_backend.VllmLaunch(
        model_path=model_path, served_model_name=name, port=free_port(), logprobs_mode=logprobs_mode
    )
    log_path = log_dir / "vllm.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = vllm_backend.start(launch, stdout=log, stderr=log)
    try:
        try:
            took = vllm_backend.wait_until_healthy(process, launch.url, timeout_s=START_TIMEOUT_S)
        except VllmStartError as exc:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
            pytest.fail(f"{exc}\n{tail}")
        rss = _group_rss_bytes(process.pid)
        yield LiveVllm(launch.url, model_path, name, log_path)
        _TIMINGS.append(
            f"vLLM {name} ({logprobs_mode}): up in {took:.0f} s, {rss / 2**30:.1f} GiB resident after start, "
            f"{time.monotonic() - started - took:.0f} s of tests"
        )
    finally:
        vllm_backend.stop(process)


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    return build_tiny_model(0)


@pytest.fixture(scope="package")  # stopped after this folder's last test, not at the end of CI's whole run
def vllm(tiny_path, tmp_path_factory) -> Iterator[LiveVllm]:
    """vLLM serving the tiny model as `harbor engine --backend vllm` starts it, for this folder's tests; or, with
    HARBOR_VLLM_LIVE_URL, one already running (`harbor engine --backend vllm`), to iterate on these tests."""
    running = os.environ.get(RUNNING_URL_ENV)
    if running:
        yield LiveVllm(running.rstrip("/"), tiny_path, "tiny", log_path=None)
        return
    with live_vllm(tiny_path, "tiny", tmp_path_factory.mktemp("vllm")) as server:
        yield server


def pytest_terminal_summary(terminalreporter) -> None:
    for line in _TIMINGS:
        terminalreporter.write_line(line)
