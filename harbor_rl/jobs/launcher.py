"""The launcher that runs on the job: start each process of the plan, wait for it to be healthy, then
wait for the last one (the trainer) while watching the others; stop them in reverse order on any exit.

Each child runs in its own process group (so stopping it also stops what it started, e.g. vLLM's
workers); its output goes to `<logs_dir>/<name>.log` and, prefixed with its name, to our stdout, which
is what `harbor jobs logs` shows.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from harbor_rl.jobs.errors import LauncherError, ProcessFailedError
from harbor_rl.jobs.plan import ProcessSpec

TAIL_LINES = 40
_print_lock = threading.Lock()


def say(text: str) -> None:
    with _print_lock:
        sys.stdout.write(f"[launcher] {text}\n")
        sys.stdout.flush()


class Child:
    """One running process of the plan, its log file and the tail of its output."""

    def __init__(self, spec: ProcessSpec, logs_dir: Path, *, echo: bool) -> None:
        self.spec = spec
        self.log_path = logs_dir / f"{spec.name}.log"
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        env = {k: v for k, v in os.environ.items() if k not in spec.unset} | spec.env
        self._log = self.log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                spec.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            self._log.close()
            raise ProcessFailedError(spec.name, f"could not start ({spec.argv[0]}: {exc})", "") from exc
        self._relay = threading.Thread(target=self._copy_output, args=(echo,), daemon=True)
        self._relay.start()

    @property
    def name(self) -> str:
        return self.spec.name

    def _copy_output(self, echo: bool) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self._log.write(raw)
            self._log.flush()
            line = raw.decode("utf-8", "replace")
            self._tail.append(line)
            if echo:
                with _print_lock:
                    sys.stdout.write(f"[{self.name}] {line}")
                    sys.stdout.flush()

    def poll(self) -> int | None:
        return self.process.poll()

    def tail(self) -> str:
        self._relay.join(timeout=2)  # after an exit, let the last lines arrive
        return "".join(self._tail)

    def failed(self, reason: str) -> ProcessFailedError:
        return ProcessFailedError(self.name, reason, self.tail())

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM its process group, SIGKILL after `grace_s`; returns the exit code."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait()
        else:  # its own children may outlive it
            self._signal(signal.SIGKILL)
        self._relay.join(timeout=5)
        self._log.close()
        return self.process.returncode

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # the whole group is already gone
            os.killpg(self.process.pid, sig)


def wait_healthy(child: Child, earlier: Sequence[Child], *, poll_s: float = 0.5) -> None:
    """GET the child's health URL until 200; fail fast when it (or one started before it) exits."""
    url, timeout = child.spec.health_url, child.spec.health_timeout_s
    assert url is not None
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0) as client:
        while True:
            code = child.poll()
            if code is not None:
                raise child.failed(f"exited with code {code} before it was healthy at {url}")
            _check_alive(earlier, f"while {child.name} was starting")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise child.failed(f"was not healthy at {url} after {timeout:.0f} s")
            time.sleep(poll_s)


def _check_alive(children: Sequence[Child], when: str) -> None:
    for other in children:
        code = other.poll()
        if code is not None:
            raise other.failed(f"exited with code {code} {when}")


def supervise(main: Child, others: Sequence[Child], *, poll_s: float = 0.5) -> int:
    """Wait for the main process to exit; a helper that exits first is a failure of the run."""
    while True:
        code = main.poll()
        if code is not None:
            return code
        _check_alive(others, f"while {main.name} was running")
        time.sleep(poll_s)


class Stopped(LauncherError):
    """The launcher was asked to stop (SIGTERM, e.g. `harbor jobs cancel`, or Ctrl-C)."""


def run_plan(
    plan: Sequence[ProcessSpec],
    logs_dir: Path,
    *,
    echo: bool = True,
    grace_s: float = 30.0,
    poll_s: float = 0.5,
    on_event: Callable[[str], None] = say,
) -> int:
    """Start every process in order, each healthy before the next; return the last one's exit code.

    The last spec is the main process (no health URL). Whatever happens (its exit, a failure of
    another, a signal), every started process is stopped, last started first.
    """
    if not plan or plan[-1].health_url is not None:
        raise LauncherError("the plan's last process must be the main one (no health URL)")
    logs_dir.mkdir(parents=True, exist_ok=True)
    children: list[Child] = []
    try:
        for spec in plan:
            on_event(f"start {spec.name}: {spec.shell()}")
            child = Child(spec, logs_dir, echo=echo)
            children.append(child)
            if spec.health_url is not None:
                wait_healthy(child, children[:-1], poll_s=poll_s)
                on_event(f"healthy {spec.name} ({spec.health_url})")
        code = supervise(children[-1], children[:-1], poll_s=poll_s)
        on_event(f"exit {children[-1].name} with code {code}")
        return code
    finally:
        for child in reversed(children):
            code = child.stop(grace_s)
            on_event(f"stop {child.name} (exit code {code}; log {child.log_path})")


def stop_on_sigterm() -> None:
    """Turn SIGTERM (a cancelled job) into an exception, so run_plan's cleanup runs."""

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup short
        raise Stopped(f"received signal {signum}; stopping")

    signal.signal(signal.SIGTERM, handler)
