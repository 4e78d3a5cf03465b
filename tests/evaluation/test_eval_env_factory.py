"""`harbor eval --harness env-factory` against an OpenAI-compatible endpoint that returns no token ids
(the scripted teacher, served over HTTP, standing in for a remote API): the capture proxy passes the
calls through in eval sessions, records their text, and the job counts tokens and tool calls."""

from __future__ import annotations

from evaluation.jobs import EvalConfig
from evaluation.runner import run_eval
from evaluation.scripted import SCRIPTED_MODEL, scripted_teacher
from tasks import load_dataset_spec


async def test_env_factory_eval_against_a_text_only_endpoint(tmp_path, runs_dir, store_url):
    from capture_proxy.store import TraceStore

    async with scripted_teacher() as url:
        config = EvalConfig(
            datasets=["env-tasks"],
            harness="env-factory",
            llm_url=url,
            model=SCRIPTED_MODEL,
            attempts=2,
        )
        summary = await run_eval(config, jobs_dir=tmp_path / "jobs", job_name="wb", store_url=store_url)
    tasks = load_dataset_spec("env-tasks").ids
    assert summary.complete and summary.scores.trials == 2 * len(tasks)
    assert summary.scores.pass_rate == 1.0 and summary.scores.pass_at_k == {"1": 1.0, "2": 1.0}
    assert summary.errors_by_kind == {}
    assert summary.model_calls >= 2 * len(tasks) and summary.tokens["completion"] > 0
    assert summary.tool_calls >= 2 * len(tasks)
    store = TraceStore(store_url)
    try:
        sessions = store.list_sessions(limit=100)
        assert len(sessions) == 2 * len(tasks) and {s.purpose for s in sessions} == {"eval"}
        turns = store.get_turns(sessions[0].session_id)
        assert turns and turns[0].completion_token_ids == []  # no ids came back: text is recorded
        assert turns[0].response["choices"][0]["message"]["tool_calls"]
    finally:
        store.close()
