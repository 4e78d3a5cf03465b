"""The list queries in SQL over a real SQLite trace store: filters, sorting, pagination, per-run rewards,
and the read-only engine."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from inspector.db import open_readonly
from inspector.errors import RolloutNotFound, StoreUnavailable
from inspector.queries import (
    NO_RUN,
    RolloutQuery,
    distinct_values,
    list_rollouts,
    load_rollout,
    reward_by_policy_version,
)
from tests.inspector.conftest import DAY, T0, add_session


def _meta(split: str, run: str | None) -> dict:
    inner = {"run": run} if run else {}
    return {"rollout": {"split": split, "metadata": inner}}


@pytest.fixture
def engine(synthetic_store):
    s = synthetic_store
    # id, day, reward, status, task, harness, split, run, policy version, turns
    rows = [
        ("r0", 0, 1.0, "completed", "builtin/hello", "mini-swe-agent", "builtin", "run-a", 0, 3),
        ("r1", 1, 0.0, "completed", "builtin/fizz", "mini-swe-agent", "builtin", "run-a", 1, 1),
        ("r2", 2, None, "failed", "builtin/hello", "opencode", "builtin", "run-a", 1, 2),
        ("r3", 3, 0.5, "completed", "extra/sort", "opencode", "extra", "run-b", 2, 5),
        ("r4", 4, 0.25, "timed_out", "extra/sort", "oracle", "extra", None, None, 1),
    ]
    for sid, day, reward, status, task, harness, split, run, pv, turns in rows:
        add_session(
            s,
            sid,
            created_at=T0 + day * DAY,
            turns=turns,
            policy_version=pv,
            metadata=_meta(split, run),
            status=status,
            task_id=task,
            harness=harness,
            reward=reward,
            finished_at=T0 + day * DAY + 10 * (day + 1),
        )
    engine = open_readonly(s.url)
    yield engine
    engine.dispose()


def ids(engine, **query) -> list[str]:
    return [r.session_id for r in list_rollouts(engine, RolloutQuery(**query)).rows]


def test_default_is_newest_first_with_facts_from_json_and_turns(engine):
    page = list_rollouts(engine, RolloutQuery())
    assert [r.session_id for r in page.rows] == ["r4", "r3", "r2", "r1", "r0"]
    assert page.total == 5 and page.pages == 1
    r3 = page.rows[1]
    assert (r3.dataset, r3.run, r3.policy_version, r3.num_turns, r3.harness) == (
        "extra",
        "run-b",
        2,
        5,
        "opencode",
    )
    assert r3.duration_s == pytest.approx(40.0)
    assert page.rows[0].run is None and page.rows[0].policy_version is None


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"dataset": "extra"}, ["r4", "r3"]),
        ({"task": "hello"}, ["r2", "r0"]),
        ({"task": "%"}, []),  # LIKE wildcards are matched literally
        ({"harness": "opencode"}, ["r3", "r2"]),
        ({"statuses": ["failed", "timed_out"]}, ["r4", "r2"]),
        ({"reward_min": 0.25}, ["r4", "r3", "r0"]),
        ({"reward_min": 0.0, "reward_max": 0.5}, ["r4", "r3", "r1"]),  # None is never inside a range
        ({"unscoreable_only": True}, ["r2"]),
        ({"policy_version_min": 1, "policy_version_max": 1}, ["r2", "r1"]),
        ({"policy_version_min": 2}, ["r3"]),
        ({"created_from": T0 + DAY, "created_to": T0 + 3 * DAY}, ["r2", "r1"]),
        ({"run": "run-a"}, ["r2", "r1", "r0"]),
        ({"run": NO_RUN}, ["r4"]),
        ({"run": "run-a", "harness": "mini-swe-agent", "reward_min": 0.5}, ["r0"]),
    ],
)
def test_filters(engine, query, expected):
    assert ids(engine, **query) == expected
    assert list_rollouts(engine, RolloutQuery(**query)).total == len(expected)


@pytest.mark.parametrize(
    ("sort", "descending", "expected"),
    [
        ("reward", True, ["r0", "r3", "r4", "r1", "r2"]),  # unscoreable last either way
        ("reward", False, ["r1", "r4", "r3", "r0", "r2"]),
        ("num_turns", True, ["r3", "r0", "r2", "r4", "r1"]),
        ("policy_version", False, ["r0", "r1", "r2", "r3", "r4"]),
        ("duration", True, ["r4", "r3", "r2", "r1", "r0"]),
        ("task_id", False, ["r1", "r0", "r2", "r3", "r4"]),
    ],
)
def test_sorting_in_sql_with_nulls_last_and_a_stable_tiebreak(engine, sort, descending, expected):
    assert ids(engine, sort=sort, descending=descending) == expected


def test_pages_cover_every_row_once(engine):
    pages = [list_rollouts(engine, RolloutQuery(sort="reward", page=p, page_size=2)) for p in (1, 2, 3, 4)]
    assert [len(p.rows) for p in pages] == [2, 2, 1, 0]
    seen = [r.session_id for p in pages for r in p.rows]
    assert sorted(seen) == ["r0", "r1", "r2", "r3", "r4"]
    assert pages[0].pages == 3 and pages[3].total == 5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reward_min": 1.0, "reward_max": 0.0}, "reward_min=1.0 is greater than reward_max=0.0"),
        ({"policy_version_min": 3, "policy_version_max": 1}, "policy_version_min=3"),
        ({"unscoreable_only": True, "reward_min": 0.0}, "cannot be combined"),
        ({"sort": "nope"}, "sort"),
        ({"page": 0}, "page"),
        ({"page_size": 10_000}, "page_size"),
        ({"statuses": ["done"]}, "statuses"),
    ],
)
def test_bad_queries_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        RolloutQuery(**fields)


def test_reward_by_policy_version_per_run(engine):
    run_a = reward_by_policy_version(engine, "run-a")
    assert [(v.policy_version, v.rollouts, v.scored, v.mean_reward) for v in run_a] == [
        (0, 1, 1, 1.0),
        (1, 2, 1, 0.0),
    ]
    everything = reward_by_policy_version(engine, None)
    assert [v.policy_version for v in everything] == [0, 1, 2, None]
    assert everything[-1].mean_reward == 0.25
    assert [v.policy_version for v in reward_by_policy_version(engine, NO_RUN)] == [None]


def test_distinct_values_feed_the_dropdowns(engine):
    assert distinct_values(engine, "dataset") == ["builtin", "extra"]
    assert distinct_values(engine, "run") == ["run-a", "run-b"]
    assert distinct_values(engine, "harness") == ["mini-swe-agent", "opencode", "oracle"]


def test_load_rollout_rebuilds_shared_prompts(engine, synthetic_store):
    loaded = load_rollout(engine, "r3")
    assert loaded.turns == synthetic_store.get_turns("r3")
    assert loaded.record == synthetic_store.get_session("r3")
    with pytest.raises(RolloutNotFound, match="no rollout 'missing'"):
        load_rollout(engine, "missing")


def test_the_engine_cannot_write(engine):
    with pytest.raises(OperationalError, match="readonly|read-only|query_only"), engine.begin() as conn:
        conn.execute(text("UPDATE sessions SET reward = 0"))


def test_unusable_stores_are_refused_with_the_reason(tmp_path):
    with pytest.raises(StoreUnavailable, match="no such file"):
        open_readonly(f"sqlite:///{tmp_path}/absent.db")
    with pytest.raises(StoreUnavailable, match="in-memory"):
        open_readonly("sqlite://")
    sqlite3.connect(tmp_path / "empty.db").close()
    with pytest.raises(StoreUnavailable, match="no trace tables yet"):
        open_readonly(f"sqlite:///{tmp_path}/empty.db")
    with pytest.raises(StoreUnavailable, match="invalid trace store URL"):
        open_readonly("not a url")


@pytest.mark.postgres
def test_same_queries_on_postgresql_read_only():
    import os
    import uuid

    from sqlalchemy import create_engine

    from capture_proxy.store import TraceStore

    url = os.environ.get("HARBOR_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("HARBOR_TEST_POSTGRES_URL is not set")
    run = f"pg-run-{uuid.uuid4().hex[:8]}"
    store = TraceStore(url)
    sids = [f"{run}-{i}" for i in range(3)]
    try:
        for i, sid in enumerate(sids):
            add_session(
                store,
                sid,
                created_at=T0 + i,
                turns=2,
                policy_version=i,
                metadata=_meta("builtin", run),
                status="completed",
                reward=None if i == 2 else float(i),
            )
        engine = open_readonly(url)
        try:
            assert ids(engine, run=run, sort="reward") == [sids[1], sids[0], sids[2]]
            assert ids(engine, run=run, policy_version_min=1) == [sids[2], sids[1]]
            assert ids(engine, run=run, dataset="builtin", reward_max=0.5) == [sids[0]]
            versions = reward_by_policy_version(engine, run)
            assert [(v.policy_version, v.mean_reward) for v in versions] == [(0, 0.0), (1, 1.0), (2, None)]
            assert load_rollout(engine, sids[1]).turns == store.get_turns(sids[1])
            with pytest.raises(Exception, match="read-only"), engine.begin() as conn:
                conn.execute(text("UPDATE sessions SET reward = 0 WHERE session_id = :s"), {"s": sids[0]})
        finally:
            engine.dispose()
    finally:
        store.close()
        cleanup = create_engine(url)
        with cleanup.begin() as conn:
            conn.execute(text("DELETE FROM sessions WHERE session_id LIKE :p"), {"p": f"{run}-%"})
        cleanup.dispose()


def test_purpose_is_train_eval_or_collect_and_every_run_is_named(synthetic_store):
    """`harbor train` rollouts name their run; `harbor collect`'s are eval-purpose with a `collect`
    folder; an eval rollout stored before eval named its run falls back to its eval job."""
    rows = [
        ("t", "train", {"run": "train-embedded"}),
        ("e", "eval", {"eval_job": "job-1", "run": "job-1"}),
        ("old", "eval", {"eval_job": "job-0"}),
        ("c", "eval", {"collect": "/data/demos", "run": "demos"}),
    ]
    for i, (sid, purpose, inner) in enumerate(rows):
        add_session(
            synthetic_store,
            sid,
            created_at=T0 + i,
            purpose=purpose,
            metadata={"rollout": {"split": "s", "metadata": inner}},
            status="completed",
        )
    engine = open_readonly(synthetic_store.url)
    try:
        page = list_rollouts(engine, RolloutQuery())
        assert {r.session_id: (r.purpose, r.run) for r in page.rows} == {
            "t": ("train", "train-embedded"),
            "e": ("eval", "job-1"),
            "old": ("eval", "job-0"),
            "c": ("collect", "demos"),
        }
        assert ids(engine, purpose="collect") == ["c"]
        assert ids(engine, purpose="eval") == ["old", "e"]
        assert ids(engine, purpose="train") == ["t"]
        assert ids(engine, run="job-0") == ["old"]
        assert distinct_values(engine, "run") == ["demos", "job-0", "job-1", "train-embedded"]
    finally:
        engine.dispose()
