"""A row per `harbor serve` id in use, with a heartbeat: a second server with a live id is refused
instead of failing the first one's rollouts as leftovers of a crash.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "server_locks",
        sa.Column("server_id", sa.String(255), nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("process_key", sa.String(255), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("heartbeat_at", sa.Double(), nullable=False),
        sa.Column("heartbeat_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("server_id", name="pk_server_locks"),
    )


def downgrade() -> None:
    op.drop_table("server_locks")
