"""Read-only SQL over the trace store's tables: the rollout list, one rollout, and per-run rewards.

Everything filters, sorts and pages in the database, so a store of 10,000 rollouts costs one indexed
query per page, never a load of every session. Facts the sessions table keeps in JSON are read with
SQLAlchemy's portable JSON paths (SQLite `json_extract`, PostgreSQL `->>`):

- dataset: `metadata.rollout.split` (set by `harbor serve`), else `metadata.dataset`;
- run: `metadata.rollout.metadata.run` (the rollout request's metadata: `harbor train` puts its run name,
  `harbor eval` its job, `harbor collect` its output folder), else `metadata.run`, else the eval job of a
  rollout stored before eval named its run;
- purpose: `train` or `eval` as the session says, `collect` for an eval-purpose rollout that
  `harbor collect` started (its request's metadata names the `collect` folder);
- policy version: the policy version the engine reported for the rollout's first stored turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import ColumnElement, Engine, Select, case, func, select
from sqlalchemy.orm import Session

from capture_proxy.models import SessionStatus, TrainingTurn
from capture_proxy.store.records import SessionRecord
from capture_proxy.store.schema import SessionRow, TurnRow

# The store rebuilds prompts stored against an earlier turn (prefix sharing); reuse its exact logic
# rather than a copy that could drift from how rows are written.
from capture_proxy.store.store import record_from_row, turns_from_rows
from inspector.errors import RolloutNotFound

NO_RUN = "(no run)"
"""How rollouts without a run name are grouped."""

PURPOSES = ("train", "eval", "collect")
"""What a rollout was for, as the list shows it (`purpose_expr`)."""

SortKey = Literal["created_at", "reward", "num_turns", "task_id", "status", "duration", "policy_version"]


def _text(*paths: tuple[str, ...]) -> ColumnElement[Any]:
    """The first present string among JSON paths of the session's metadata."""
    values = [SessionRow.meta[path].as_string() for path in paths]
    return func.coalesce(*values) if len(values) > 1 else values[0]


dataset_expr = _text(("rollout", "split"), ("dataset",)).label("dataset")
run_expr = _text(("rollout", "metadata", "run"), ("run",), ("rollout", "metadata", "eval_job")).label("run")
purpose_expr = case(
    (SessionRow.purpose == "train", "train"),
    (SessionRow.meta[("rollout", "metadata", "collect")].as_string().is_not(None), "collect"),
    else_=SessionRow.purpose,
).label("purpose")
policy_version_expr = (
    select(TurnRow.meta["policy_version"].as_integer())
    .where(TurnRow.session_id == SessionRow.session_id)
    .order_by(TurnRow.seq)
    .limit(1)
    .correlate(SessionRow)
    .scalar_subquery()
    .label("policy_version")
)
duration_expr = (SessionRow.finished_at - SessionRow.created_at).label("duration")

_SORT_COLUMNS: dict[str, ColumnElement[Any]] = {
    "created_at": SessionRow.created_at,
    "reward": SessionRow.reward,
    "num_turns": SessionRow.num_turns,
    "task_id": SessionRow.task_id,
    "status": SessionRow.status,
    "duration": duration_expr,
    "policy_version": policy_version_expr,
}


class RolloutQuery(BaseModel):
    """Filters, sort order and page of the rollout list. Unset filters match everything."""

    model_config = ConfigDict(extra="forbid")

    dataset: str | None = None
    """Exact dataset (split) name."""
    task: str | None = None
    """Substring of the task id."""
    harness: str | None = None
    statuses: list[SessionStatus] = Field(default_factory=list)
    """Any of these statuses; empty means all."""
    reward_min: float | None = None
    reward_max: float | None = None
    """Reward bounds (inclusive). Either bound excludes unscoreable rollouts (reward None)."""
    unscoreable_only: bool = False
    """Only rollouts whose reward is None."""
    policy_version_min: int | None = None
    policy_version_max: int | None = None
    created_from: float | None = None
    created_to: float | None = None
    """Creation time bounds, Unix seconds (from inclusive, to exclusive)."""
    run: str | None = None
    """Exact run name; NO_RUN selects rollouts without one."""
    purpose: Literal["train", "eval", "collect"] | None = None
    """What the rollouts were for (see PURPOSES)."""
    sort: SortKey = "created_at"
    descending: bool = True
    page: int = Field(default=1, ge=1)
    page_size: int = Field(default=50, ge=1, le=500)

    @model_validator(mode="after")
    def _ranges(self) -> RolloutQuery:
        for low, high in (
            ("reward_min", "reward_max"),
            ("policy_version_min", "policy_version_max"),
            ("created_from", "created_to"),
        ):
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"{low}={lo} is greater than {high}={hi}")
        if self.unscoreable_only and (self.reward_min is not None or self.reward_max is not None):
            raise ValueError("unscoreable_only selects reward None; it cannot be combined with reward bounds")
        return self


@dataclass(frozen=True)
class RolloutSummary:
    """One line of the rollout list."""

    session_id: str
    status: str
    purpose: str
    """train, eval or collect (PURPOSES)."""
    task_id: str | None
    dataset: str | None
    harness: str | None
    model: str
    reward: float | None
    num_turns: int
    created_at: float
    duration_s: float | None
    policy_version: int | None
    run: str | None
    error: str | None


@dataclass(frozen=True)
class RolloutPage:
    rows: list[RolloutSummary]
    total: int
    """Rollouts matching the filters, over all pages."""
    page: int
    page_size: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.page_size))


@dataclass(frozen=True)
class StoredRollout:
    """One rollout as stored: its session record and its turns in call order."""

    record: SessionRecord
    turns: list[TrainingTurn]


@dataclass(frozen=True)
class VersionReward:
    """Rewards of one run's rollouts sampled at one policy version."""

    policy_version: int | None
    rollouts: int
    scored: int
    """Rollouts with a reward (the rest are unscoreable and left out of the mean)."""
    mean_reward: float | None
    min_reward: float | None
    max_reward: float | None


def _where(query: RolloutQuery) -> list[ColumnElement[bool]]:
    clauses: list[ColumnElement[bool]] = []
    if query.dataset:
        clauses.append(dataset_expr == query.dataset)
    if query.task:
        clauses.append(SessionRow.task_id.contains(query.task, autoescape=True))
    if query.harness:
        clauses.append(SessionRow.harness == query.harness)
    if query.statuses:
        clauses.append(SessionRow.status.in_(query.statuses))
    if query.unscoreable_only:
        clauses.append(SessionRow.reward.is_(None))
    if query.reward_min is not None:
        clauses.append(SessionRow.reward >= query.reward_min)
    if query.reward_max is not None:
        clauses.append(SessionRow.reward <= query.reward_max)
    if query.policy_version_min is not None:
        clauses.append(policy_version_expr >= query.policy_version_min)
    if query.policy_version_max is not None:
        clauses.append(policy_version_expr <= query.policy_version_max)
    if query.created_from is not None:
        clauses.append(SessionRow.created_at >= query.created_from)
    if query.created_to is not None:
        clauses.append(SessionRow.created_at < query.created_to)
    if query.purpose:
        clauses.append(purpose_expr == query.purpose)
    if query.run == NO_RUN:
        clauses.append(run_expr.is_(None))
    elif query.run:
        clauses.append(run_expr == query.run)
    return clauses


_SUMMARY_COLUMNS = (
    SessionRow.session_id,
    SessionRow.status,
    purpose_expr,
    SessionRow.task_id,
    dataset_expr,
    SessionRow.harness,
    SessionRow.model,
    SessionRow.reward,
    SessionRow.num_turns,
    SessionRow.created_at,
    duration_expr,
    policy_version_expr,
    run_expr,
    SessionRow.error,
)


def _summary(row: Any) -> RolloutSummary:
    return RolloutSummary(
        session_id=row.session_id,
        status=row.status,
        purpose=row.purpose,
        task_id=row.task_id,
        dataset=row.dataset,
        harness=row.harness,
        model=row.model,
        reward=row.reward,
        num_turns=row.num_turns,
        created_at=row.created_at,
        duration_s=row.duration,
        policy_version=row.policy_version,
        run=row.run,
        error=row.error,
    )


def list_rollouts(engine: Engine, query: RolloutQuery) -> RolloutPage:
    """One page of rollouts matching `query`, sorted in SQL; NULLs sort last either way.

    The page's ids are chosen first from the sessions table alone; the per-rollout facts that live in
    the turns table (policy version) are read for those ids only, unless the sort or a filter needs
    them for every row: reading a turn's metadata walks past its token blobs, which is the slow part.
    """
    clauses = _where(query)
    key = _SORT_COLUMNS[query.sort]
    order = [key.is_(None), key.desc() if query.descending else key.asc()]
    # A stable tiebreak, so pages neither repeat nor skip rows.
    order.append(SessionRow.session_id.desc() if query.descending else SessionRow.session_id.asc())
    page_ids = (
        select(SessionRow.session_id)
        .where(*clauses)
        .order_by(*order)
        .limit(query.page_size)
        .offset((query.page - 1) * query.page_size)
    )
    count_q = select(func.count()).select_from(SessionRow).where(*clauses)
    with engine.connect() as conn:
        total = conn.execute(count_q).scalar_one()
        ids = list(conn.execute(page_ids).scalars())
        rows_q: Select[Any] = select(*_SUMMARY_COLUMNS).where(SessionRow.session_id.in_(ids))
        by_id = {r.session_id: _summary(r) for r in conn.execute(rows_q)} if ids else {}
    return RolloutPage(rows=[by_id[i] for i in ids], total=total, page=query.page, page_size=query.page_size)


def load_rollout(engine: Engine, session_id: str) -> StoredRollout:
    """The session record and all its turns; RolloutNotFound when there is no such session."""
    with Session(engine) as s:
        row = s.get(SessionRow, session_id)
        if row is None:
            raise RolloutNotFound(session_id)
        record = record_from_row(row)
        turn_rows = s.scalars(
            select(TurnRow).where(TurnRow.session_id == session_id).order_by(TurnRow.seq)
        ).all()
        return StoredRollout(record=record, turns=turns_from_rows(session_id, turn_rows))


def distinct_values(engine: Engine, column: Literal["dataset", "harness", "task_id", "run"]) -> list[str]:
    """The distinct non-empty values of a filterable column, sorted (for the filter dropdowns)."""
    expr = {
        "dataset": dataset_expr,
        "harness": SessionRow.harness,
        "task_id": SessionRow.task_id,
        "run": run_expr,
    }[column]
    with engine.connect() as conn:
        values = conn.execute(select(expr).where(expr.is_not(None)).distinct()).scalars()
        return sorted(v for v in values if v)


def reward_by_policy_version(engine: Engine, run: str | None) -> list[VersionReward]:
    """Per policy version, the reward of the run's rollouts (None: every rollout in the store).

    Versions ascend; rollouts whose turns carry no policy version come last (policy_version None).
    """
    per_rollout = select(policy_version_expr, SessionRow.reward.label("reward"))
    if run == NO_RUN:
        per_rollout = per_rollout.where(run_expr.is_(None))
    elif run:
        per_rollout = per_rollout.where(run_expr == run)
    sub = per_rollout.subquery()
    grouped = (
        select(
            sub.c.policy_version,
            func.count().label("rollouts"),
            func.count(sub.c.reward).label("scored"),
            func.avg(sub.c.reward).label("mean_reward"),
            func.min(sub.c.reward).label("min_reward"),
            func.max(sub.c.reward).label("max_reward"),
        )
        .group_by(sub.c.policy_version)
        .order_by(sub.c.policy_version.is_(None), sub.c.policy_version)
    )
    with engine.connect() as conn:
        return [
            VersionReward(
                policy_version=r.policy_version,
                rollouts=r.rollouts,
                scored=r.scored,
                mean_reward=None if r.mean_reward is None else float(r.mean_reward),
                min_reward=r.min_reward,
                max_reward=r.max_reward,
            )
            for r in conn.execute(grouped)
        ]


def count_rollouts(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(SessionRow)).scalar_one()


def status_counts(engine: Engine, statuses: Sequence[str] | None = None) -> dict[str, int]:
    """Rollouts per status (all statuses present, or only `statuses`)."""
    q = select(SessionRow.status, func.count()).group_by(SessionRow.status)
    if statuses:
        q = q.where(SessionRow.status.in_(statuses))
    with engine.connect() as conn:
        return {status: n for status, n in conn.execute(q)}
