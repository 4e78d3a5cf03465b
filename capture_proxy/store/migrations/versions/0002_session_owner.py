"""Sessions record their owner: the server running them, so several servers can share one store.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: existing rows keep NULL ("no owner recorded"), and adding such a column is
    # a catalogue-only change on PostgreSQL and SQLite alike (no table rewrite, however many rows).
    op.add_column("sessions", sa.Column("owner", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("owner")
