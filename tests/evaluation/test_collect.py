"""`harbor collect --provider scripted` end to end: the scripted teacher served over HTTP, the real
capture proxy and in-process Harbor server, the env-factory harness on the local sandbox. The
dataset loads with `datasets`; a killed run resumes with the same ids on the same tasks; a corrupt
line is skipped with a warning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from capture_proxy.episodes import CorruptLineWarning
from capture_proxy.store import TraceStore
from evaluation.collect import CollectConfig, DatasetMisaligned, run_collect
from harbor_rl.cli import app
from tasks import load_dataset_spec

pytestmark = pytest.mark.timeout(600)
HARBOR = [sys.executable, "-m", "harbor_rl"]
"""The CLI of this checkout (a `harbor` console script may belong to another install)."""
TASKS = load_dataset_spec("env-tasks").ids
"""The built-in white-box tasks in dataset order: episode i runs TASKS[i % len(TASKS)]."""


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_scripted_collect_writes_a_dataset_that_datasets_reads(tmp_path, runs_dir, store_url):
    import datasets

    out = tmp_path / "sft"
    result = CliRunner().invoke(
        app,
        ["collect", "--provider", "scripted", "-n", "4", "--output-dir", str(out), "--store", store_url],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    ds = datasets.load_dataset(
        "json", data_files=str(out / "results.jsonl"), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert ds.num_rows == 4
    assert set(ds.column_names) == {
        "episode_id", "messages", "reward", "done", "tool_trace", "metrics", "verify_metrics", "artifacts", "task", "extra",
        "tools",
    }  # fmt: skip
    offered = {t["function"]["name"] for row in ds for t in row["tools"]}
    assert offered == {"echo", "guess"}  # the tools SFT renders into the prompt
    assert ds["episode_id"] == [f"episode-{i:06d}" for i in range(4)]
    assert [t["task_id"] for t in ds["task"]] == [TASKS[i % len(TASKS)] for i in range(4)]
    for row in ds:
        assert row["done"] and row["reward"] >= 1.0  # the script wins every game
        assert row["messages"][0]["role"] == "user"
        assert row["messages"][-1]["role"] == "assistant" and row["tool_trace"]
        assert row["verify_metrics"]["reward"] == row["reward"]
        assert row["metrics"]["model_calls"] >= 1 and row["metrics"]["completion_tokens"] > 0
    echo = next(r for r in ds if r["task"]["task_id"] == "echo-hello-world")  # ran: TASKS has <= 4 tasks
    assert json.loads(echo["tool_trace"][0]["arguments"]) == {"message": "Hello World!"}
    metadata = json.loads((out / "metadata.json").read_text())
    assert (
        metadata["provider"] == "scripted" and metadata["num_written"] == 4 and metadata["dropped_ids"] == []
    )
    # The teacher's calls are capture sessions in the store (eval purpose, text without token ids).
    store = TraceStore(store_url)
    try:
        for row in ds:
            record = store.get_session(row["artifacts"]["rollout_id"])
            assert record.purpose == "eval" and record.num_turns == row["metrics"]["model_calls"]
            assert record.metadata["rollout"]["episode_id"] == row["episode_id"]
    finally:
        store.close()


def test_killed_collect_resumes_with_the_same_ids_on_the_same_tasks(tmp_path, runs_dir, store_url):
    out = tmp_path / "sft"
    args = [*HARBOR, "collect", "--provider", "scripted", "-n", "10", "--max-concurrent", "1",
            "-o", str(out), "--store", store_url]  # fmt: skip
    env = dict(os.environ, HARBOR_RUNS_DIR=str(runs_dir))
    proc = subprocess.Popen(
        args, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 300
    results = out / "results.jsonl"
    while not results.exists() or len(results.read_text().splitlines()) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    before = {line["episode_id"]: line for line in _lines(results)}
    assert 2 <= len(before) < 10
    resumed = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True, timeout=500)
    assert resumed.returncode == 0, resumed.stderr
    lines = _lines(results)
    ids = [line["episode_id"] for line in lines]
    assert ids == [f"episode-{i:06d}" for i in range(10)]  # each once, in order
    for line in lines:
        index = int(line["episode_id"].rsplit("-", 1)[1])
        assert line["task"]["task_id"] == TASKS[index % len(TASKS)]
        if line["episode_id"] in before:  # kept, not run again
            assert line["artifacts"]["rollout_id"] == before[line["episode_id"]]["artifacts"]["rollout_id"]


async def test_corrupt_line_is_skipped_with_a_warning_and_rerun(tmp_path, runs_dir, store_url):
    out = tmp_path / "sft"
    config = CollectConfig(provider="scripted", datasets=["env-tasks"], num_episodes=3, harness="env-factory")
    await run_collect(config, out_dir=out, store_url=store_url)
    results = out / "results.jsonl"
    lines = results.read_text().splitlines()
    damaged = [lines[0], '{"episode_id": "episode-000001", "messages": [', lines[2], lines[0], '{"truncated']
    results.write_text("\n".join(damaged))  # no final newline: a write cut short
    with pytest.warns(CorruptLineWarning) as record:
        summary = await run_collect(config, out_dir=out, store_url=store_url, resume=True)
    caught = [w for w in record if issubclass(w.category, CorruptLineWarning)]  # not others' warnings
    assert [str(w.message).split(": skipping")[0].rsplit(":", 1)[1] for w in caught] == ["2", "4", "5"]
    assert "second line for episode-000000" in str(caught[1].message)
    assert summary.ran == 1 and summary.skipped == 2 and summary.written == 3
    final = _lines(results)  # every line valid JSON again
    assert Counter(line["episode_id"] for line in final) == Counter(f"episode-{i:06d}" for i in range(3))


async def test_resume_refuses_a_file_planned_for_other_tasks(tmp_path, runs_dir, store_url):
    out = tmp_path / "sft"
    config = CollectConfig(provider="scripted", datasets=["env-tasks"], num_episodes=2)
    await run_collect(config, out_dir=out, store_url=store_url)
    only_wordle = config.model_copy(update={"task_globs": ["wordle-*"]})
    with pytest.raises(DatasetMisaligned, match="episode-000000 holds task 'echo-hello-world'"):
        await run_collect(only_wordle, out_dir=out, store_url=store_url, resume=True)
    with pytest.raises(DatasetMisaligned, match="--resume"):
        await run_collect(config, out_dir=out, store_url=store_url)


async def test_should_keep_drops_losses_and_resume_does_not_rerun_them(tmp_path, runs_dir, store_url):
    out = tmp_path / "sft"
    # A bar no scripted episode reaches: every episode is dropped and remembered in metadata.json.
    config = CollectConfig(provider="scripted", datasets=["env-tasks"], num_episodes=2, min_reward=5.0)
    summary = await run_collect(config, out_dir=out, store_url=store_url)
    assert (summary.written, summary.dropped) == (0, 2)
    assert json.loads((out / "metadata.json").read_text())["dropped_ids"] == [
        "episode-000000",
        "episode-000001",
    ]
    again = await run_collect(config, out_dir=out, store_url=store_url, resume=True)
    assert again.ran == 0 and again.skipped == 2
    kept = await run_collect(
        config.model_copy(update={"keep_losses": True, "num_episodes": 3}),
        out_dir=out,
        store_url=store_url,
        resume=True,
    )
    assert kept.ran == 1 and kept.written == 1


async def test_openai_provider_uses_the_given_endpoint(tmp_path, runs_dir, store_url):
    """The `openai` teacher is any OpenAI-compatible URL; here the scripted server stands in for one."""
    from pydantic import ValidationError

    from evaluation.scripted import scripted_teacher

    with pytest.raises(ValidationError, match="--provider openai needs --llm-url and --model"):
        CollectConfig(provider="openai", datasets=["builtin"])
    async with scripted_teacher() as url:
        config = CollectConfig(
            provider="openai", llm_url=url, model="teacher-x", datasets=["env-tasks"], num_episodes=1
        )
        summary = await run_collect(config, out_dir=tmp_path / "sft", store_url=store_url)
    assert summary.written == 1
    [line] = _lines(tmp_path / "sft" / "results.jsonl")
    assert line["extra"]["provider"] == "openai" and line["extra"]["model"] == "teacher-x"
