"""`harbor train --engines 2` as a user runs it: two embedded engine processes behind one trainer, the
rollouts spread over both, every turn's version the one its engine had, and one engine SIGKILLed
mid-run without losing a rollout (trainer.engines)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

FAST = [
    "--eval-episodes", "0", "--set", "sft_steps=0", "--set", "base_eval_episodes=0", "--set", "report_to=jsonl",
    "--set", "max_completion_length=16",
]  # fmt: skip


def train(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "harbor_rl", "train", "--engines", "2", *FAST, *args, "--output-dir", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip


def finish(run: subprocess.Popen, timeout_s: float = 240) -> str:
    try:
        output, _ = run.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        run.kill()
        output, _ = run.communicate()
    assert run.returncode == 0, output
    return output


def store(out: Path) -> sqlite3.Connection:
    db = sqlite3.connect(f"file:{out / 'traces.db'}?mode=ro", uri=True, timeout=30)
    db.row_factory = sqlite3.Row
    return db


def summary(out: Path) -> list[dict]:
    return json.loads((out / "engines.json").read_text())["engines"]


def engine_pid(url: str) -> int:
    """The `harbor engine` process serving `url` (its --port), found in /proc as `ps` would."""
    port = url.rsplit(":", 1)[1]
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"engine" in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == port.encode():
            return int(entry.name)
    raise AssertionError(f"no engine process serves {url}")


def test_rollouts_spread_over_two_engines_each_rollout_on_one_and_each_turn_at_its_engines_version(tmp_path):
    # mini-swe-agent makes two model calls per rollout (the fix, the submit): multi-turn rollouts.
    out = tmp_path / "run"
    run = train(
        out, "--harness", "mini-swe-agent", "--max-steps", "2", "--set", "num_generations=2",
        "--set", "per_device_train_batch_size=4", "--set", "gradient_accumulation_steps=1",
        "--set", "max_concurrent_rollouts=4",
    )  # fmt: skip
    output = finish(run)
    assert "stopped answering" not in output
    engines = summary(out)
    urls = [e["url"] for e in engines]
    assert len(set(urls)) == 2 and all(e["train_rollouts"] > 0 for e in engines), engines
    # Every version went to both engines, in order.
    assert [[p["version"] for p in e["pushes"]] for e in engines] == [[1, 2, 3]] * 2
    db = store(out)
    sessions = {r["session_id"]: r for r in db.execute("SELECT session_id, llm_url FROM sessions")}
    served = {url: 0 for url in urls}
    multi_turn = 0
    for sid, row in sessions.items():
        turns = [
            json.loads(t["metadata"])
            for t in db.execute("SELECT metadata FROM turns WHERE session_id = ?", (sid,))
        ]
        # The rollout's engine is one of the two, and every one of its turns ran there.
        assert row["llm_url"].removesuffix("/v1") in urls
        assert {t["engine_url"] for t in turns} <= {row["llm_url"]}, (sid, turns)
        multi_turn += len(turns) > 1
        served[row["llm_url"].removesuffix("/v1")] += 1
        pushes = next(e["pushes"] for e in engines if e["url"] == row["llm_url"].removesuffix("/v1"))
        for t in turns:
            v = t["policy_version"]
            if v is None:  # a call the engine never answered (a cancelled rollout at the run's end)
                continue
            # That engine had taken version v before the turn ended, and had not taken v+1 before it began.
            took = next(p for p in pushes if p["version"] == v)
            assert took["started"] <= t["created_at"], (t, took)
            later = [p for p in pushes if p["version"] == v + 1]
            assert not later or t["created_at"] - t["latency_s"] <= later[0]["finished"], (t, later)
    db.close()
    assert multi_turn >= 4 and all(served.values()), served
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    assert (
        last["engines/live"] == 2 and last["engines/0/train_rollouts"] + last["engines/1/train_rollouts"] >= 8
    )


def running_on(out, url: str) -> set[str]:
    """The rollouts of the run in `out` running on the engine at `url`."""
    with contextlib.closing(store(out)) as db:
        rows = db.execute("SELECT session_id FROM sessions WHERE llm_url = ? AND status = 'running'", (url + "/v1",))
        return {r[0] for r in rows}


def test_killing_one_engine_mid_run_loses_nothing_and_the_run_trains_on_the_other(tmp_path):
    out = tmp_path / "run"
    run = train(
        out, "--max-steps", "6", "--set", "num_generations=4", "--set", "per_device_train_batch_size=8",
        "--set", "max_concurrent_rollouts=8",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        # Once the second engine serves version 2 and holds a running rollout: freeze it (SIGSTOP) so
        # its rollouts cannot finish, see which are in flight, and SIGKILL it. The tiny model's rollouts
        # are short: one may end between the look and the freeze, so with none left the engine goes on.
        while True:
            assert run.poll() is None and time.monotonic() < deadline, "no rollout ran on the second engine"
            try:
                victim = summary(out)[1]
            except (OSError, ValueError, IndexError):
                time.sleep(0.05)
                continue
            if len(victim["pushes"]) >= 2 and running_on(out, victim["url"]):
                pid = engine_pid(victim["url"])
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.5)
                in_flight = running_on(out, victim["url"])
                if in_flight:
                    break
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        output = finish(run)
    finally:
        if run.poll() is None:
            run.kill()
    # One warning, naming the engine.
    assert output.count("stopped answering") == 1 and victim["url"] in output, output
    engines = summary(out)
    assert engines[1]["dead"] and not engines[0]["dead"]
    pushed = [[p["version"] for p in e["pushes"]] for e in engines]
    assert pushed[0] == list(range(1, 8))  # every version to the live one; the dead one is skipped after
    assert pushed[1] == list(range(1, len(pushed[1]) + 1)) and len(pushed[1]) < 7
    with contextlib.closing(store(out)) as db:
        rows = {
            r["session_id"]: r for r in db.execute("SELECT session_id, status, reward, error FROM sessions")
        }
    # Nothing lost: every rollout in flight on the killed engine is in the store, ended, unscoreable.
    for sid in in_flight:
        assert rows[sid]["status"] == "failed" and rows[sid]["reward"] is None, dict(rows[sid])
    assert not [s for s, r in rows.items() if r["status"] == "running"]
    assert engines[1]["unscoreable"] >= len(in_flight)
    # The run went on: every step trained, on the other engine's rollouts.
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 7)) and metrics[-1]["policy_version"] == 7
    assert metrics[-1]["engines/live"] == 1 and metrics[-1]["rollout/failed_total"] >= len(in_flight)
    assert all(m["rollout/scoreable"] > 0 for m in metrics)
