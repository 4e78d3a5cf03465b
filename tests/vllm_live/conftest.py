"""The real vLLM (its CPU build) for tests/vllm_live, from the venv that `bash scripts/setup.sh --with-vllm`
builds; every test here is skipped, with that command as the reason, when the venv is absent. A start
takes 30-170 s and ~3 GiB, so the tiny model's server (`vllm`) is started once for the folder, and the two
modules that need another (raw logprobs, the scripted tool-call model) start one each beside it: two at
once at most. The end of the run prints each server's start time, memory and the time its tests took."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine import vllm_backend
from engine.errors import VllmNotInstalled, VllmStartError
from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
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


def require_venv() -> None:
    try:
        vllm_backend.vllm_python()
    except VllmNotInstalled as exc:
        pytest.skip(f"live vLLM tests need vLLM's CPU build: {exc}")


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _family(root: int) -> dict[int, str]:
    """Every live descendant of `root`: pid -> its start time (so a reused pid is not taken for it)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if (fields := _stat(pid)) is not None:
            found[pid] = fields[19]
            todo += children.get(pid, [])
    return found


def _rss_bytes(pids) -> int:
    return sum(int(f[21]) * os.sysconf("SC_PAGE_SIZE") for pid in pids if (f := _stat(pid)) is not None)


def _alive(family: dict[int, str]) -> list[int]:
    return [
        pid
        for pid, start in family.items()
        if (f := _stat(pid)) is not None and f[19] == start and f[0] != "Z"
    ]


@contextlib.contextmanager
def live_vllm(
    model_path: Path, name: str, log_dir: Path, logprobs_mode: str = "processed_logprobs"
) -> Iterator[LiveVllm]:
    """`harbor engine --backend vllm` serving `model_path` as `name` until the block ends (its log in
    `log_dir`/vllm.log); then SIGTERM, as harbor train stops its engine, and no vLLM process may be left."""
    require_venv()
    port = free_port()
    cmd = [
        sys.executable, "-m", "harbor_rl", "engine", "--backend", "vllm", "--model", str(model_path),
        "--served-model-name", name, "--port", str(port), "--logprobs-mode", logprobs_mode,
    ]  # fmt: skip
    log_path = log_dir / "vllm.log"
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        cli = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        try:
            took = vllm_backend.wait_until_healthy(cli, url, timeout_s=START_TIMEOUT_S)
        except VllmStartError as exc:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
            pytest.fail(f"{exc}\n{tail}")
        family = _family(cli.pid)  # vLLM's API server, engine core and worker
        rss = _rss_bytes(family)
        yield LiveVllm(url, model_path, name, log_path)
        _TIMINGS.append(
            f"vLLM {name} ({logprobs_mode}): up in {took:.0f} s, {rss / 2**30:.1f} GiB resident after start, "
            f"{time.monotonic() - started - took:.0f} s of tests"
        )
    finally:
        cli.send_signal(signal.SIGTERM)
        try:
            cli.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
    deadline = time.monotonic() + 30
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _alive(family) == [], f"vLLM processes left after harbor engine's SIGTERM: {_alive(family)}"
    assert cli.returncode == 0, log_path.read_text(errors="replace")[-2000:]


@pytest.fixture(scope="module")
def imitation():
    """engine/imitation.py serving `tiny`, what the fast tests use in vLLM's place, to compare with the live one."""
    with serve_in_thread(create_imitation_app(ImitationSettings(model="tiny"))) as url:
        yield url


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
