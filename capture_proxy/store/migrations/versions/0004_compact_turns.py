"""Turns store what is new in them: a request's messages as a count shared with the base turn plus the
rest, and a response without the fields its arrays already hold (store/compact.py).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Defaulting to 0 is what the rows already stored mean: nothing shared, nothing elided. A
    # constant default keeps this a catalogue-only change on SQLite and PostgreSQL (no table rewrite).
    op.add_column(
        "turns", sa.Column("request_shared", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column(
        "turns", sa.Column("response_elided", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )


def downgrade() -> None:
    # Compact rows cannot be read without these columns: downgrading a store that has any loses them.
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("response_elided")
        batch.drop_column("request_shared")
