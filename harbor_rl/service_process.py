"""The embedded run's engine (`harbor engine`) and Harbor server (`harbor serve`), each a process of its
own, as they run beside a trainer in a real deployment.

`harbor train` starts both for its runs (`GRPOTrainer` the engine only: its server serves the user's
own environment classes, so it stays in the training process). On threads of the training process,
their Python work (the engine's decode loop, which dispatches every layer's ops from Python on a small
model; the server's event loops, the capture proxy, the white-box episodes) took turns at one
interpreter lock with the trainer: in one `harbor train` run the trainer's forward and backward passes
spent 4.8 of their 23 s waiting for it. As processes they run side by side, reached the way vLLM and
`harbor serve` are reached: HTTP, and the weight-transfer routes (gloo here) for new weights.

Each process is told to die with this one (the kernel's parent-death signal), so a crash of the run
leaves neither behind; its output goes to a log file whose tail a failed start reports. Each runs in a
process group of its own, so the terminal's Ctrl-C reaches only the run, which then stops them in order
(harbor_rl.interrupts): the server after the trainer has cancelled its rollouts, the engine last.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from harbor_rl import interrupts
from trainer.errors import TrainerConfigError

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent goes (Linux; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    from harbor_server import free_port as pick

    return pick()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ServiceProcess:
    """`harbor <command> ...` serving HTTP on 127.0.0.1:`port`, started at once; `url` is known before it
    answers, so whatever talks to it can be set up meanwhile."""

    def __init__(self, name: str, args: list[str], port: int, log_path: Path) -> None:
        self.name = name
        """What it is, for messages ("the embedded engine")."""
        self.url = f"http://127.0.0.1:{port}"
        """Base URL (no /v1)."""
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "harbor_rl", *args], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, start_new_session=True,
            )  # fmt: skip
        interrupts.register_child(self._process.pid, name)

    def wait_until_up(self, timeout_s: float = 120.0) -> str:
        """Block until it answers /health; returns its URL. TrainerConfigError, with the end of its log,
        when it exits or does not answer within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self._process.poll() is not None:
                    raise TrainerConfigError(
                        f"{self.name} exited with {self._process.returncode} while starting (log: "
                        f"{self.log_path}):\n" + _tail(self.log_path)
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.url + "/health").status_code == 200:
                        return self.url
                if time.monotonic() > deadline:
                    raise TrainerConfigError(
                        f"{self.name} did not answer within {timeout_s:.0f} s (log: {self.log_path}):\n"
                        + _tail(self.log_path)
                    )
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM (the server cancels its live rollouts and stops their sandboxes), SIGKILL to its group
        after 30 s, or after 5 s once the run was interrupted: the user waits on it."""
        self._process.terminate()
        try:
            self._process.wait(timeout=5 if interrupts.interrupted() else 30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        interrupts.unregister_child(self._process.pid)

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


ENGINE_NAMES = {"embedded": "the embedded engine", "vllm": "vLLM (CPU build)"}
"""What each engine backend is called in messages."""


def engine_process(
    model_path: Path, served_name: str, *, max_model_len: int, log_path: Path, device: str = "cpu",
    backend: str = "embedded",
) -> ServiceProcess:  # fmt: skip
    """`harbor engine` serving `model_path` as `served_name`: the embedded engine, or with `backend`
    "vllm" vLLM's CPU build (engine.vllm_backend: its venv, the guide's flags, gloo weight transfer)."""
    port = free_port()
    args = [
        "engine", "--model", str(model_path), "--served-model-name", served_name, "--port", str(port),
        "--max-model-len", str(max_model_len), "--device", device, "--log-level", "warning", "--backend", backend,
    ]  # fmt: skip
    return ServiceProcess(ENGINE_NAMES[backend], args, port, log_path)


def server_process(
    datasets: list[str], *, llm_url: str, model: str, sandbox: str, store_url: str, max_concurrent: int,
    server_id: str, log_path: Path,
) -> ServiceProcess:  # fmt: skip
    """`harbor serve` over `datasets`, its capture port on loopback for local sandboxes and on every
    interface for the others (Docker's bridge gateway reaches it there)."""
    port, capture_port = free_port(), free_port()
    args = ["serve", *(a for d in datasets for a in ("--dataset", d))]
    args += [
        "--llm-url", llm_url, "--model", model, "--port", str(port), "--capture-port", str(capture_port),
        "--capture-host", "127.0.0.1" if sandbox == "local" else "0.0.0.0", "--sandbox", sandbox,
        "--store", store_url, "--max-concurrent", str(max_concurrent), "--server-id", server_id,
        "--skip-engine-check", "--log-level", "warning",
    ]  # fmt: skip
    return ServiceProcess("the embedded Harbor server", args, port, log_path)


@contextlib.contextmanager
def running(service: ServiceProcess, start_timeout_s: float = 120.0) -> Iterator[str]:
    """`service` for the block; yields its base URL once it answers /health."""
    with service:
        yield service.wait_until_up(start_timeout_s)
