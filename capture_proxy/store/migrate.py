"""Bring a store's schema to the newest Alembic revision, cheaply when it is already there."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from capture_proxy.errors import StoreError
from capture_proxy.store.engine import WRITE_OPTION, redact

MIGRATIONS_DIR = Path(__file__).parent / "migrations"

# Any constant: serializes concurrent first-time migrations of one PostgreSQL database.
_PG_MIGRATION_LOCK = 0x4841_5242_4F52  # "HARBOR"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def head_revision() -> str:
    """The newest revision; reading the scripts costs milliseconds, so it is read once per process."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise StoreError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def upgrade_to_head(engine: Engine) -> None:
    """Migrate to head unless already there: one SELECT on an up-to-date database."""
    head = head_revision()
    shown = redact(engine.url)
    try:
        with engine.connect() as conn:
            if current_revision(conn) == head:
                return
        # Migrate under the write lock (SQLite) or an advisory lock (PostgreSQL), re-checking inside
        # it: two processes opening a fresh store at once must not both create the tables.
        with engine.execution_options(**{WRITE_OPTION: True}).begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
            current = current_revision(conn)
            if current == head:
                return
            known = {
                script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()
            }
            if current is not None and current not in known:
                raise StoreError(
                    f"trace store {shown} is at schema revision {current!r}, which this version of "
                    f"harbor-rl does not know (newest known: {head!r}); upgrade harbor-rl"
                )
            command.upgrade(alembic_config(conn), "head")
    except StoreError:
        raise
    except Exception as exc:
        raise StoreError(f"cannot open trace store {shown}: {type(exc).__name__}: {exc}") from exc
