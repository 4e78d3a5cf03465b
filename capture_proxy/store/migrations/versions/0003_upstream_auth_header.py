"""Sessions record the header their upstream credential goes in, for engines gated by a header other than
`Authorization: Bearer` (OpenEnv's `auth_header`).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default (None: `Authorization: Bearer`): a catalogue-only change, as 0002's.
    op.add_column("sessions", sa.Column("upstream_auth_header", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("upstream_auth_header")
