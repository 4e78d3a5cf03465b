"""`harbor collect` in OpenEnv's form (`openenv collect ENV --base-url URL -o DIR -n N --provider ...`,
openenv 0.10.0 `openenv/cli/commands/collect.py`): the positional ENV and -n offline on the
in-process server; `--base-url` against a running `harbor serve`; `--provider anthropic` through the
real `anthropic` SDK against a stand-in of Anthropic's Messages API (our own capture proxy's Messages
route, itself in front of the scripted teacher), whose episodes come out as the openai provider's do;
the resume refusal naming only flags that exist."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from capture_proxy.app import create_app
from capture_proxy.config import ProxyConfig
from capture_proxy.models import SessionCreated
from capture_proxy.store import TraceStore
from engine.in_process import serve_in_thread
from evaluation.collect import CollectConfig, run_collect
from evaluation.scripted import create_scripted_app
from harbor_rl.cli import app
from tasks import load_dataset_spec
from tests.server.conftest import make_config, running_server

pytestmark = pytest.mark.timeout(600)
TASKS = load_dataset_spec("env-tasks").ids
ADMIN_KEY = "stand-in-admin-key-0123"
CLAUDE = "claude-stand-in"


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def _one_line_error(result, *words: str) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 2, result.output
    assert lines[0].startswith("harbor collect: ") and "--debug" in lines[1]
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_openenv_command_line_runs_offline_and_resume_names_flags_that_exist(tmp_path, runs_dir, store_url):
    out = tmp_path / "ttt-scripted"
    args = ["collect", "env-tasks", "--output-dir", str(out), "-n", "3", "--provider", "scripted"]
    result = CliRunner().invoke(app, [*args, "--store", store_url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert [r["episode_id"] for r in rows] == [f"episode-{i:06d}" for i in range(3)]
    assert [r["task"]["task_id"] for r in rows] == [TASKS[i % len(TASKS)] for i in range(3)]
    assert all(r["reward"] >= 1.0 and r["done"] for r in rows)
    assert json.loads((out / "metadata.json").read_text())["datasets"] == ["env-tasks"]

    again = CliRunner().invoke(app, [*args, "--store", store_url])
    line = _one_line_error(again, "already has episodes", "--resume", "--output-dir")
    assert "--output " not in line + " " and not line.endswith("--output")
    resumed = CliRunner().invoke(app, [*args, "-n", "4", "--resume", "--store", store_url])
    assert resumed.exit_code == 0, resumed.output
    assert [r["episode_id"] for r in _rows(out)] == [f"episode-{i:06d}" for i in range(4)]


def test_help_and_bad_values(tmp_path, runs_dir):
    help_text = CliRunner().invoke(app, ["collect", "--help"], terminal_width=200).output
    for words in ("[ENV]", "--base-url", "anthropic", "--num-episodes", "-n"):
        assert words in help_text
    out = tmp_path / "o"
    _one_line_error(
        CliRunner().invoke(app, ["collect", "--provider", "bogus", "-o", str(out)]), "'bogus'", "anthropic"
    )
    _one_line_error(
        CliRunner().invoke(
            app, ["collect", "--provider", "scripted", "--base-url", "ftp://x", "-o", str(out)]
        ),
        "--base-url 'ftp://x'",
    )
    _one_line_error(
        CliRunner(env={"ANTHROPIC_API_KEY": "", "API_KEY": "", "HARBOR_LLM_API_KEY": ""}).invoke(
            app, ["collect", "--provider", "anthropic", "--model", CLAUDE, "-o", str(out)]
        ),
        "ANTHROPIC_API_KEY",
    )
    _one_line_error(
        CliRunner().invoke(app, ["collect", "--provider", "anthropic", "-o", str(out)]), "--model"
    )
    assert not out.exists()


def test_base_url_collects_from_a_running_harbor_serve(tmp_path, runs_dir):
    server_store = f"sqlite:///{tmp_path}/server.db"
    config = make_config(tmp_path, datasets=["env-tasks"], store_url=server_store)
    out = tmp_path / "remote"
    with running_server(config) as server:
        args = [
            "collect",
            "env-tasks",
            "--base-url",
            server.url,
            "-o",
            str(out),
            "-n",
            "3",
            "--provider",
            "scripted",
        ]
        result = CliRunner().invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        store_given = CliRunner().invoke(app, [*args, "--resume", "--store", f"sqlite:///{tmp_path}/x.db"])
        _one_line_error(store_given, "--store", "--base-url")
        unknown = CliRunner().invoke(app, ["collect", "bultin", "--base-url", server.url, "-o", str(tmp_path / "u"),
                                           "--provider", "scripted"])  # fmt: skip
        _one_line_error(unknown, "serves no dataset 'bultin'", "env-tasks")
    rows = _rows(out)
    assert [r["task"]["task_id"] for r in rows] == [TASKS[i % len(TASKS)] for i in range(3)]
    assert all(r["reward"] >= 1.0 and r["extra"]["model"] == "scripted" for r in rows)
    assert all(r["messages"][-1]["role"] == "assistant" and r["tool_trace"] for r in rows)
    assert json.loads((out / "metadata.json").read_text())["base_url"] == server.url
    store = TraceStore(server_store)  # the rollouts are the server's, in its store
    try:
        for row in rows:
            record = store.get_session(row["artifacts"]["rollout_id"])
            assert record.purpose == "eval" and record.num_turns == row["metrics"]["model_calls"]
    finally:
        store.close()
    assert not (out / "traces.db").exists()


def _comparable(row: dict) -> dict:
    """An episode without what differs between runs of one policy: ids, timings, the provider's name."""
    ids = {
        call["id"]: f"call-{i}"
        for i, call in enumerate(c for m in row["messages"] for c in m.get("tool_calls") or [])
    }
    messages = [
        {
            **m,
            **(
                {"tool_calls": [{**c, "id": ids[c["id"]]} for c in m["tool_calls"]]}
                if m.get("tool_calls")
                else {}
            ),
            **({"tool_call_id": ids[m["tool_call_id"]]} if m.get("tool_call_id") else {}),
        }
        for m in row["messages"]
    ]
    trace = [{**t, "call_id": ids.get(t["call_id"])} for t in row["tool_trace"]]
    return {"messages": messages, "tool_trace": trace, "reward": row["reward"], "tools": row["tools"],
            "task": row["task"], "done": row["done"], "model_calls": row["metrics"]["model_calls"]}  # fmt: skip


async def test_anthropic_provider_through_the_messages_api_matches_openai(tmp_path, runs_dir, monkeypatch):
    stand_in_store = TraceStore(f"sqlite:///{tmp_path}/stand-in.db")
    with serve_in_thread(create_scripted_app()) as scripted_url:
        proxy = create_app(ProxyConfig(upstream_url=scripted_url, admin_key=ADMIN_KEY), stand_in_store)
        with serve_in_thread(proxy) as anthropic_url:
            reply = httpx.post(f"{anthropic_url}/sessions", json={"model": CLAUDE, "purpose": "eval"},
                               headers={"Authorization": f"Bearer {ADMIN_KEY}"})  # fmt: skip
            assert reply.status_code == 201, reply.text
            session = SessionCreated.model_validate(reply.json())
            monkeypatch.setenv("ANTHROPIC_API_KEY", session.api_key)  # as OpenEnv reads it
            common = {"datasets": ["env-tasks"], "num_episodes": 4, "n_concurrent": 1}
            claude = CollectConfig(provider="anthropic", model=CLAUDE, llm_url=anthropic_url, **common)
            summary = await run_collect(
                claude, out_dir=tmp_path / "anthropic", store_url=f"sqlite:///{tmp_path}/a.db"
            )
            assert summary.written == 4 and summary.errors == 0, summary
            openai = CollectConfig(provider="openai", model=CLAUDE, llm_url=f"{scripted_url}/v1", **common)
            await run_collect(openai, out_dir=tmp_path / "openai", store_url=f"sqlite:///{tmp_path}/o.db")
    try:
        turns = stand_in_store.get_turns(session.session_id)
    finally:
        stand_in_store.close()
    anthropic_rows, openai_rows = _rows(tmp_path / "anthropic"), _rows(tmp_path / "openai")
    # Every teacher call went over Anthropic's Messages API, one per model call of the episodes.
    assert len(turns) == sum(r["metrics"]["model_calls"] for r in anthropic_rows)
    assert {t.metadata.dialect for t in turns} == {"anthropic-messages"}
    assert all(
        r["extra"]["provider"] == "anthropic" and r["extra"]["model"] == CLAUDE for r in anthropic_rows
    )
    assert [_comparable(r) for r in anthropic_rows] == [_comparable(r) for r in openai_rows]
    assert all(r["reward"] >= 1.0 for r in anthropic_rows)
