"""Ctrl-C (SIGINT) and SIGTERM for the long commands (`train`, `eval`, `collect`, `serve`): the first one
stops the run in order and the command exits 128+signal (130 for Ctrl-C) with one line; a second one
kills at once.

Where the first signal lands depends on what the main thread is doing:
- running an asyncio loop started with `run()` (eval, collect): its main task is cancelled, so every
  `async with` closes on the way out (live rollouts cancelled, sandboxes stopped), as asyncio.run
  itself does on a first Ctrl-C, and for SIGTERM too;
- inside `held()` (a GRPO update and its bookkeeping, which a checkpoint must never split): a
  KeyboardInterrupt as the block ends;
- anywhere else: a KeyboardInterrupt at once, Python's own behaviour.
`harbor_rl.cli` turns the KeyboardInterrupt into `harbor CMD: interrupted; <notes>` and the exit code.

The services a run starts (`harbor_rl.service_process`: the engine, the Harbor server) run in process
groups of their own, so the terminal's Ctrl-C reaches only the command, which stops them in order
(rollouts cancelled before the server, the server before the engine). A second signal SIGKILLs those
groups and leaves with os._exit: nothing waits on a thread, a lock or a child. Sandboxes die with their
server (bubblewrap's --die-with-parent); a Docker container left so is removed by the next server's
start-up sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """GRPO stopped by a signal: the steps it finished and the checkpoint of the last one (None: none
    was written, see `HarnessAsyncGRPOTrainer._save_interrupted`)."""

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"interrupted after GRPO step {step}")
        self.step = step
        self.checkpoint = checkpoint


@dataclasses.dataclass
class _State:
    command: str = "harbor"
    signum: int | None = None
    """The first signal received (None: not interrupted)."""
    count: int = 0
    holding: int = 0
    """How deep in `held()` blocks the main thread is."""
    pending: bool = False
    """A first signal came inside `held()`: raise as the block ends."""
    children: dict[int, str] = dataclasses.field(default_factory=dict)
    """Process group id -> what it is, of the services this process started."""
    tasks: set[tuple[asyncio.AbstractEventLoop, asyncio.Task, int]] = dataclasses.field(default_factory=set)
    """(loop, main task, thread id) of each `run()` under way."""
    notes: list[str] = dataclasses.field(default_factory=list)
    pid: int = dataclasses.field(default_factory=os.getpid)
    """The process that installed the handlers (a forked child inherits them until it execs)."""
    unjoined: list[threading.Thread] = dataclasses.field(default_factory=list)
    """Daemon threads an interrupt does not wait for (`leave_behind`)."""


_state = _State()
_event = threading.Event()


def install(command: str) -> None:
    """Handle SIGINT and SIGTERM for `harbor COMMAND` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _state.command = command
    _state.pid = os.getpid()
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)


@contextlib.contextmanager
def handling(command: str) -> Iterator[None]:
    """`install(command)` for the block; then the handlers before it, and a fresh state (a test runs many
    commands in one process)."""
    global _state
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    install(command)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state = _State()
        _event.clear()


def interrupted() -> bool:
    """Whether a first signal has come (threads poll this to stop starting work)."""
    return _event.is_set()


def exit_code() -> int:
    """128 + the signal, as a shell reports a command a signal ended: 130 for Ctrl-C."""
    return 128 + (_state.signum or signal.SIGINT)


def note(text: str) -> None:
    """Add `text` to the interrupted line (what was saved, how to go on)."""
    _state.notes.append(text)


def message() -> str:
    """`interrupted; <notes>`: what follows `harbor CMD: ` on the one line a first signal ends with."""
    how = "interrupted" if _state.signum in (None, signal.SIGINT) else "stopped by SIGTERM"
    return f"{how}; " + ("; ".join(_state.notes) or "stopped")


def resume_command() -> str:
    """This command line again with --resume: the same settings go on where the interrupt stopped."""
    import shlex

    args = sys.argv[1:]
    return shlex.join(["harbor", *args, *([] if "--resume" in args else ["--resume"])])


def leave_behind(thread: threading.Thread) -> None:
    """A daemon thread that an interrupted command does not wait for (the SFT warm-up: a step runs for
    seconds in torch). If it still runs when the command ends, `finish()` leaves without the interpreter's
    shutdown, which would abort on it ("terminate called without an active exception")."""
    _state.unjoined.append(thread)


def finish(code: int) -> None:
    """After the interrupted line: leave at once when a `leave_behind` thread still runs (everything of
    the run's own is closed by now), else return and let the command exit as usual."""
    if any(thread.is_alive() for thread in _state.unjoined):
        import logging

        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def register_child(pid: int, what: str) -> None:
    """A child started in its own process group (start_new_session) that a second signal kills."""
    _state.children[pid] = what


def unregister_child(pid: int) -> None:
    _state.children.pop(pid, None)


def mark(signum: int) -> None:
    """Record a first signal that someone else's handler received (the Harbor server's own)."""
    if _state.signum is None:
        _state.signum = signum
    _state.count = max(_state.count, 1)
    _event.set()


def _on_signal(signum: int, _frame: Any) -> None:
    if os.getpid() != _state.pid:
        return  # a child between fork and exec (the terminal signals the whole group): its exec decides
    _state.count += 1
    if _state.count > 1:
        kill_now()
    mark(signum)
    in_a_loop = False
    for loop, task, thread in list(_state.tasks):
        with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
            loop.call_soon_threadsafe(task.cancel)
        in_a_loop |= thread == threading.main_thread().ident
    if in_a_loop:
        return  # the cancellation unwinds the main thread's loop; nothing to raise here
    if _state.holding:
        _state.pending = True
        return
    raise KeyboardInterrupt


def kill_now() -> None:
    """The second signal: SIGKILL every registered child's process group, one line, exit at once."""
    for pgid in list(_state.children):
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.write(
            sys.stderr.fileno(), f"harbor {_state.command}: interrupted again; killed at once\n".encode()
        )
    os._exit(exit_code())


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A first signal in the block is delivered (as KeyboardInterrupt) when it ends, so the block
    runs whole or not at all. A second signal still kills at once."""
    _state.holding += 1
    try:
        yield
    finally:
        _state.holding -= 1
    if _state.holding == 0 and _state.pending:
        _state.pending = False
        raise KeyboardInterrupt


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(coro), with a first signal cancelling its main task (KeyboardInterrupt comes out)."""

    async def main() -> T:
        entry = (asyncio.get_running_loop(), asyncio.current_task(), threading.get_ident())
        _state.tasks.add(entry)
        try:
            if interrupted():  # the signal came as this loop started
                coro.close()
                raise asyncio.CancelledError
            return await coro
        finally:
            _state.tasks.discard(entry)

    if interrupted():  # never started: close it, so Python does not warn it was never awaited
        coro.close()
        raise KeyboardInterrupt
    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if interrupted():
            raise KeyboardInterrupt from None
        raise
