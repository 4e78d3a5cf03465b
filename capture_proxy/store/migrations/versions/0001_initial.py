"""Initial trace store schema: sessions and turns.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("api_key_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("purpose", sa.String(8), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("llm_url", sa.Text(), nullable=False),
        sa.Column("upstream_api_key", sa.Text(), nullable=True),
        sa.Column("sampling", sa.JSON(), nullable=False),
        sa.Column("max_model_calls", sa.Integer(), nullable=False),
        sa.Column("multi_step_task", sa.Boolean(), nullable=False),
        sa.Column("task_id", sa.String(255), nullable=True),
        sa.Column("harness", sa.String(64), nullable=True),
        sa.Column("sandbox", sa.String(64), nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("rewards", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("num_turns", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="pk_sessions"),
        sa.UniqueConstraint("api_key_hash", name="uq_sessions_api_key_hash"),
    )
    op.create_index("ix_sessions_created_at", "sessions", ["created_at"])
    op.create_index("ix_sessions_status_created_at", "sessions", ["status", "created_at"])
    op.create_index("ix_sessions_purpose_created_at", "sessions", ["purpose", "created_at"])
    op.create_index("ix_sessions_task_id_created_at", "sessions", ["task_id", "created_at"])
    op.create_table(
        "turns",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("prompt_base_seq", sa.Integer(), nullable=True),
        sa.Column("prompt_shared_len", sa.Integer(), nullable=False),
        sa.Column("prompt_ids", sa.LargeBinary(), nullable=False),
        sa.Column("completion_ids", sa.LargeBinary(), nullable=False),
        sa.Column("logps", sa.LargeBinary(), nullable=False),
        sa.Column("loss_mask", sa.LargeBinary(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.session_id"],
            name="fk_turns_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id", "prompt_base_seq"],
            ["turns.session_id", "turns.seq"],
            name="fk_turns_session_id_turns",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", name="pk_turns"),
    )
    if op.get_bind().dialect.name == "postgresql":
        _tune_postgres_toast()


def _tune_postgres_toast() -> None:
    """Token arrays do not compress (random-looking int32s): store them out of line without trying,
    which saves the server a pglz pass per row. JSON text compresses well: lz4 (PostgreSQL >= 14
    built with it) does so several times faster than the default pglz. Storage settings only; the
    tables' logical schema is the same on every backend."""
    for column in ("prompt_ids", "completion_ids", "logps", "loss_mask"):
        op.execute(f"ALTER TABLE turns ALTER COLUMN {column} SET STORAGE EXTERNAL")
    lz4 = op.get_bind().exec_driver_sql(
        "SELECT count(*) FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)"
    )
    if lz4.scalar():
        for column in ("request", "response", "metadata"):
            op.execute(f"ALTER TABLE turns ALTER COLUMN {column} SET COMPRESSION lz4")


def downgrade() -> None:
    op.drop_table("turns")
    op.drop_index("ix_sessions_task_id_created_at", table_name="sessions")
    op.drop_index("ix_sessions_purpose_created_at", table_name="sessions")
    op.drop_index("ix_sessions_status_created_at", table_name="sessions")
    op.drop_index("ix_sessions_created_at", table_name="sessions")
    op.drop_table("sessions")
