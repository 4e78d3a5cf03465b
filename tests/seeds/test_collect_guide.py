"""OpenEnv's rewards / harness / collect guide, 6.7: its one command (OpenEnv's
`src/openenv/core/harness/README.md:19-24`, `guide/openenv_collect.sh`)

    openenv collect openspiel:tic_tac_toe --base-url https://<user>-<space>.hf.space \\
        --output-dir /tmp/ttt-scripted -n 10 --provider scripted

runs here as `openenv_collect.sh`: `openenv` is `harbor`, and the Space, which cannot be reached
offline, is a local `harbor serve --dataset openspiel:tic_tac_toe` (its URL in `$HARBOR_URL`); nothing
else changes (`collect_command_line`). In OpenEnv the URL is the game's OpenEnv environment server and the
collect process drives it; here the episodes run on a harbor serve of the same game (DeepMind's
OpenSpiel engine, `tasks.environments.openspiel`), so the teacher's calls are captured sessions in the
server's trace store, as every `harbor collect --base-url` is. An OpenEnv environment server given as
--base-url is refused with one line that says what to serve instead.

What the guide says, checked: results.jsonl holds one line per episode with EpisodeRecord's fields;
ids are `<prefix>-<6 digits>`; `messages` is a conversation TRL's SFTTrainer reads; `reward` is the
environment's (the game's return, not a silent 0); the scripted teacher plays legal moves (the first
legal one, as OpenEnv's); resume skips the ids already written, even past a corrupt line; the CLI keeps
reward >= 0 unless `--keep-losses`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.seeds.guide_diff import HERE, ROOT, changes, running

pytestmark = pytest.mark.timeout(300)

SPACE_URL = "https://<user>-<space>.hf.space"
"""The guide's placeholder for the user's Hugging Face Space."""
LOCAL_URL = '"$HARBOR_URL"'
"""What stands for it in the seed: the local harbor serve's URL."""
OUTPUT_DIR = Path("/tmp/ttt-scripted")
"""The guide's --output-dir, kept as written (the test clears it before and after, under a lock)."""
FIELDS = ("episode_id", "messages", "reward", "done", "tool_trace", "metrics", "verify_metrics", "artifacts",
          "task", "extra")  # fmt: skip
"""OpenEnv's EpisodeRecord (openenv/core/harness/collect.py), the guide's field table."""


def collect_command_line(guide: str | None, ours: str | None) -> bool:
    """A command line whose leading `openenv` is `harbor` and whose Space URL is the local server's; any
    other change (a flag, a value, a line added or removed) is refused."""
    if guide is None or ours is None:
        return False
    expected = re.sub(r"^openenv ", "harbor ", guide).replace(SPACE_URL, LOCAL_URL)
    return expected != guide and ours == expected


def refused_command_changes(name: str) -> list[tuple[str | None, str | None]]:
    guide = (HERE / "guide" / f"{name}.sh").read_text()
    ours = (HERE / f"{name}.sh").read_text()
    return [pair for pair in changes(guide, ours) if not collect_command_line(*pair)]


def test_the_seed_command_differs_from_the_guide_only_by_the_command_rule() -> None:
    guide = (HERE / "guide" / "openenv_collect.sh").read_text()
    ours = (HERE / "openenv_collect.sh").read_text()
    assert changes(guide, ours) == [
        ("openenv collect openspiel:tic_tac_toe \\", "harbor collect openspiel:tic_tac_toe \\"),
        (f"    --base-url {SPACE_URL} \\", f"    --base-url {LOCAL_URL} \\"),
    ]
    assert not refused_command_changes("openenv_collect")


def test_the_command_rule_refuses_any_other_change() -> None:
    first = "openenv collect openspiel:tic_tac_toe \\"
    assert collect_command_line(first, "harbor collect openspiel:tic_tac_toe \\")
    assert not collect_command_line(first, first)  # an unchanged line is no change to allow
    assert not collect_command_line(first, "harbor collect openspiel:catch \\")
    assert not collect_command_line(first, "harbor collect env-tasks \\")
    assert not collect_command_line(first, "harbor-rl collect openspiel:tic_tac_toe \\")
    assert not collect_command_line(f"    --base-url {SPACE_URL} \\", "    --base-url http://example.com \\")
    assert not collect_command_line("    -n 10 --provider scripted", "    -n 2 --provider scripted")
    assert not collect_command_line("    -n 10 --provider scripted", "    -n 10 --provider scripted --resume")
    assert not collect_command_line(None, "    --keep-losses \\")
    assert not collect_command_line("    --output-dir /tmp/ttt-scripted \\", None)


# -- running it ---------------------------------------------------------------------------------------


def _env(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "bin" / "harbor"  # the `harbor` a user's install puts on PATH, as this interpreter
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m harbor_rl "$@"\n')
    shim.chmod(0o755)
    return os.environ | {
        "PATH": f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "HARBOR_RUNS_DIR": str(tmp_path / "runs"),
        "HARBOR_CACHE_DIR": str(tmp_path / "cache"),
        "NO_COLOR": "1",
    }


@contextlib.contextmanager
def harbor_serve(tmp_path: Path, env: dict[str, str], dataset: str) -> Iterator[str]:
    """`harbor serve --dataset DATASET` as a user starts it (on free ports), until the block ends."""
    from harbor_server import free_port

    port, capture_port = free_port(), free_port()
    command = ["harbor", "serve", "--dataset", dataset, "--port", str(port), "--capture-port",
               str(capture_port), "--store", f"sqlite:///{tmp_path}/server.db"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with running(command, env, tmp_path / "serve.log", f"{url}/health", cwd=tmp_path):
        yield url


@pytest.fixture
def guide_output_dir() -> Iterator[Path]:
    """The guide's /tmp/ttt-scripted, empty, held by this test alone (another run of it waits)."""
    import fcntl

    with OUTPUT_DIR.with_name(f"{OUTPUT_DIR.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(OUTPUT_DIR, ignore_errors=True)
        try:
            yield OUTPUT_DIR
        finally:
            shutil.rmtree(OUTPUT_DIR, ignore_errors=True)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def _board(text: str) -> list[str]:
    """The 9 cells of a board as OpenEnv renders it (`X | 1 | 2` rows): X, O, or the empty cell's id."""
    return [cell.strip() for row in text.split("\n---------\n") for cell in row.split("|")]


def _checked_return(row: dict) -> float | None:
    """Replay the episode on a fresh OpenSpiel game: the teacher's moves from its tool calls (each must be
    the first legal action of the observation before it, OpenEnv's scripted teacher), the opponent's from
    the board each move showed. The agent's return when the replay reaches the end; None when the
    opponent moved last (its move is not in the transcript)."""
    import pyspiel

    state = pyspiel.load_game("tic_tac_toe").new_initial_state()
    legal, board = list(range(9)), [str(i) for i in range(9)]
    for call in row["tool_trace"]:
        assert call["name"] == "play_move"
        action = json.loads(call["arguments"])["action_id"]
        assert action == legal[0], (row["episode_id"], action, legal)
        state.apply_action(action)
        if call["output"] is None:  # the episode ended on this move
            break
        shown = json.loads(call["output"])
        after = _board(shown["board"])
        (opponent,) = [i for i, (was, now) in enumerate(zip(board, after, strict=True)) if now == "O" != was]
        state.apply_action(opponent)
        legal, board = shown["legal_actions"], after
    return float(state.returns()[0]) if state.is_terminal() else None


@pytest.mark.slow
def test_the_guides_collect_command_runs_and_does_what_the_guide_says(tmp_path, guide_output_dir) -> None:
    env = _env(tmp_path)
    with harbor_serve(tmp_path, env, "openspiel:tic_tac_toe") as url:
        done = subprocess.run(["bash", str(HERE / "openenv_collect.sh")], env=env | {"HARBOR_URL": url},
                              cwd=tmp_path, capture_output=True, text=True, timeout=200)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        rows = _rows(guide_output_dir)

        # One line per episode, EpisodeRecord's fields, ids <prefix>-<6 digits> in order.
        assert len(rows) == 10
        assert all(set(FIELDS) <= row.keys() for row in rows)
        assert [row["episode_id"] for row in rows] == [f"episode-{i:06d}" for i in range(10)]
        assert all(re.fullmatch(r".+-\d{6}", row["episode_id"]) for row in rows)

        # messages: a chat SFTTrainer reads (the game's prompt, the teacher's play_move calls, the results).
        for row in rows:
            roles = [m["role"] for m in row["messages"]]
            assert (
                roles[0] == "user"
                and roles[-1] == "assistant"
                and set(roles) == {"user", "assistant", "tool"}
            )
            assert row["messages"][0]["content"].startswith("You are playing tic_tac_toe.")
            assert "Legal actions: [0, 1, 2, 3, 4, 5, 6, 7, 8]" in row["messages"][0]["content"]
        import datasets

        loaded = datasets.load_dataset(
            "json", data_files=str(guide_output_dir / "results.jsonl"), split="train"
        )
        assert len(loaded) == 10 and set(FIELDS) <= set(loaded.column_names)

        # reward: the environment's, the game's real outcome, never a silent 0.
        for row in rows:
            assert row["done"] and row["task"] == {"split": "openspiel:tic_tac_toe", "task_id": "tic_tac_toe"}
            assert row["reward"] in (1.0, 0.0) and row["verify_metrics"]["env_reward"] == row["reward"]
            replayed = _checked_return(row)
            assert replayed == row["reward"] or (replayed is None and row["reward"] == 0.0), row["episode_id"]
        assert sum(row["reward"] == 1.0 for row in rows) >= 5  # first-legal wins most games against random
        first_rollouts = {row["episode_id"]: row["artifacts"]["rollout_id"] for row in rows}

        # Resume: the same command, 20 episodes, past a line a killed run left half written. The ten
        # already there are skipped (same records), the new ones run, and the CLI's keep filter drops
        # the losses (reward < 0), remembering them in metadata.json.
        with (guide_output_dir / "results.jsonl").open("a") as f:
            f.write('{"episode_id": "episode-0000')
        command = ["harbor", "collect", "openspiel:tic_tac_toe", "--base-url", url, "--output-dir",
                   str(guide_output_dir), "--provider", "scripted"]  # fmt: skip
        resumed = subprocess.run([*command, "-n", "20", "--resume"], env=env, capture_output=True, text=True,
                                 timeout=200)  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "10 already done, 10 to run" in " ".join(resumed.stderr.split())
        again = _rows(guide_output_dir)
        assert {r["episode_id"]: r["artifacts"]["rollout_id"] for r in again[:10]} == first_rollouts
        metadata = json.loads((guide_output_dir / "metadata.json").read_text())
        dropped = set(metadata["dropped_ids"])
        kept = {r["episode_id"] for r in again}
        assert dropped and kept | dropped == {f"episode-{i:06d}" for i in range(20)} and not kept & dropped
        assert all(r["reward"] >= 0 for r in again)

        # --keep-losses (OpenEnv's flag) keeps them, with the game's -1: a copy of what was kept, resumed
        # with it, runs only the dropped ids.
        losses = tmp_path / "with-losses"
        losses.mkdir()
        shutil.copy(guide_output_dir / "results.jsonl", losses / "results.jsonl")
        kept_all = subprocess.run([*command[:5], "--output-dir", str(losses), "--provider", "scripted", "-n", "20",
                                   "--resume", "--keep-losses"], env=env, capture_output=True, text=True,
                                  timeout=200)  # fmt: skip
        assert kept_all.returncode == 0, kept_all.stderr[-3000:]
        assert f"{len(dropped)} to run" in " ".join(kept_all.stderr.split())
        new = [r for r in _rows(losses) if r["episode_id"] in dropped]
        assert len(new) == len(dropped) and all(r["reward"] == -1.0 for r in new)
        for row in new:
            assert _checked_return(row) in (None, -1.0)

    # The teacher's calls are the server's capture sessions.
    from capture_proxy.store import TraceStore

    store = TraceStore(f"sqlite:///{tmp_path}/server.db")
    try:
        for row in rows:
            assert (
                store.get_session(row["artifacts"]["rollout_id"]).num_turns == row["metrics"]["model_calls"]
            )
    finally:
        store.close()


# -- the game, the teacher and the errors, on their own -------------------------------------------------


def test_the_game_rewards_only_its_end_and_refuses_illegal_moves() -> None:
    pytest.importorskip("pyspiel")
    from tasks.environments.openspiel import OpenSpielEnv

    env = OpenSpielEnv()
    first = env.reset(game="tic_tac_toe", seed=3)
    assert first.startswith("Legal actions: [0, 1, 2, 3, 4, 5, 6, 7, 8]") and "0 | 1 | 2" in first
    shown = json.loads(env.play_move(4))
    assert env.reward is None and not env.done and shown["reward"] == 0.0  # unfinished: no reward, not 0
    assert 4 not in shown["legal_actions"] and len(shown["legal_actions"]) == 7
    with pytest.raises(ValueError, match="not legal"):
        env.play_move(4)
    while not env.done:
        env.play_move(env._legal()[0])
    assert env.reward in (1.0, 0.0, -1.0)
    with pytest.raises(ValueError, match="Game over"):
        env.play_move(0)
    again = OpenSpielEnv()
    again.reset(game="tic_tac_toe", seed=3)
    assert json.loads(again.play_move(4))["board"] == shown["board"]  # the seed fixes the opponent's moves


def test_the_scripted_teacher_plays_the_first_legal_move_of_the_latest_observation() -> None:
    from evaluation.scripted import scripted_reply

    tools = [{"type": "function", "function": {"name": "play_move"}}]
    prompt = {"role": "user", "content": "You are playing tic_tac_toe.\n\nLegal actions: [0, 1, 2]"}
    reply = scripted_reply({"messages": [prompt], "tools": tools})
    assert json.loads(reply["tool_calls"][0]["function"]["arguments"]) == {"action_id": 0}
    result = {"role": "tool", "content": json.dumps({"legal_actions": [5, 7], "done": False})}
    reply = scripted_reply(
        {"messages": [prompt, {"role": "assistant", "content": ""}, result], "tools": tools}
    )
    assert json.loads(reply["tool_calls"][0]["function"]["arguments"]) == {"action_id": 5}
    over = {"role": "tool", "content": json.dumps({"legal_actions": [], "done": True})}
    assert "tool_calls" not in scripted_reply({"messages": [prompt, over], "tools": tools})


def _one_line(result, *words: str) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 2 and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_missing_open_spiel_or_unknown_game_is_one_line(tmp_path, monkeypatch) -> None:
    from harbor_rl.cli import app

    monkeypatch.setenv("HARBOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    out = tmp_path / "o"
    args = ["collect", "-o", str(out), "--provider", "scripted", "--store", f"sqlite:///{tmp_path}/t.db"]
    pytest.importorskip("pyspiel")
    _one_line(CliRunner().invoke(app, [*args, "openspiel:tictactoe"]), "no game 'tictactoe'", "tic_tac_toe")
    monkeypatch.setitem(sys.modules, "pyspiel", None)  # as if open_spiel were not installed
    _one_line(CliRunner().invoke(app, [*args, "openspiel:tic_tac_toe"]), "pip install 'harbor-rl[openspiel]'")
    assert not (out / "results.jsonl").exists()


def test_an_openenv_environment_server_as_base_url_is_one_line(tmp_path) -> None:
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    from engine.in_process import serve_in_thread
    from harbor_rl.cli import app

    class Move(Action):
        action_id: int = 0

    class Seen(Observation):
        legal_actions: list[int] = []

    class Game(Environment):
        def reset(self, seed=None, episode_id=None, **kwargs):
            return Seen(legal_actions=[0])

        def step(self, action, timeout_s=None, **kwargs):
            return Seen(done=True, reward=1.0)

        @property
        def state(self):
            return State()

    out = tmp_path / "o"
    with serve_in_thread(create_app(Game, Move, Seen, env_name="game")) as url:
        result = CliRunner().invoke(
            app,
            ["collect", "openspiel:tic_tac_toe", "--base-url", url, "-o", str(out), "--provider", "scripted"],
        )
    _one_line(result, "OpenEnv environment server", "harbor serve --dataset openspiel:tic_tac_toe")
    from fastapi import FastAPI

    with serve_in_thread(FastAPI()) as url:  # neither harbor nor OpenEnv: every path answers 404
        result = CliRunner().invoke(
            app, ["collect", "openspiel:tic_tac_toe", "--base-url", url, "-o", str(out)]
        )
    assert "OpenEnv" not in _one_line(result, f"{url} is not a harbor serve: GET /info answered 404")
    assert not out.exists()


def test_openenvs_flag_names_are_accepted() -> None:
    import typer

    from harbor_rl.cli import app

    collect = typer.main.get_command(app).commands["collect"]
    names = {opt for param in collect.params for opt in param.opts}
    assert {"--base-url", "--output-dir", "-n", "--provider", "--keep-losses", "--episode-id-prefix"} <= names
