"""TraceStore: capture sessions and their turns in any SQLAlchemy database (SQLite by default)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from sqlalchemy import JSON, Engine, bindparam, exists, insert, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from capture_proxy.errors import InvalidSessionUpdate, SessionNotFound, StoreError, TurnExists
from capture_proxy.models import SessionStatus, TrainingTurn, TurnMetadata
from capture_proxy.store import codec, compact, prefix
from capture_proxy.store.engine import WRITE_OPTION, create_store_engine, default_store_url, redact
from capture_proxy.store.engine import _json_dumps as to_json
from capture_proxy.store.migrate import upgrade_to_head
from capture_proxy.store.records import TERMINAL_STATUSES, SessionRecord
from capture_proxy.store.schema import SessionRow, TurnRow
from capture_proxy.store.server_locks import ServerLocks

# SessionRecord field -> SessionRow attribute, where they differ (`metadata` is reserved by SQLAlchemy).
_ROW_ATTR = {"metadata": "meta"}
_FIELDS = tuple(SessionRecord.model_fields)
_UPDATABLE = frozenset(_FIELDS) - {"session_id", "num_turns", "owner"}
"""num_turns is the store's to maintain; the id is the key; the owner is set once, at creation."""

_sessions = SessionRow.__table__
_BUMP_NUM_TURNS = (
    update(_sessions)
    .where(_sessions.c.session_id == bindparam("sid"))
    .values(num_turns=_sessions.c.num_turns + bindparam("n"))
)


class _RawSQL:
    """The proxy's per-call writes (a new session, a call's turns), compiled once for the engine's
    dialect and run on the raw DBAPI cursor: an ORM (or even Core) execution costs several times the
    database's own work for rows this small (a session insert: 440 -> 115 us). Values are bound as
    the driver takes them; the JSON columns are serialised here (what the engine's JSON type would do)."""

    def __init__(self, engine: Engine):
        dialect = engine.dialect
        self.begin = "BEGIN IMMEDIATE" if dialect.name == "sqlite" else None
        """SQLite: take the write lock up front (the engine's own transactions do the same)."""
        bump = _BUMP_NUM_TURNS.compile(dialect=dialect)
        add = insert(TurnRow.__table__).compile(dialect=dialect)
        new_session = insert(_sessions).compile(dialect=dialect)
        self.bump, self._bump_order = bump.string, bump.positiontup
        self.insert, self._insert_order = add.string, add.positiontup
        self.insert_session, self._session_order = new_session.string, new_session.positiontup
        self._session_json = frozenset(c.key for c in _sessions.columns if isinstance(c.type, JSON))
        self.errors = dialect.loaded_dbapi.Error
        self.integrity = dialect.loaded_dbapi.IntegrityError

    def bump_args(self, session_id: str, n: int) -> dict | tuple:
        return self._bound({"sid": session_id, "n": n}, self._bump_order)

    def insert_args(self, values: dict[str, Any]) -> dict | tuple:
        return self._bound(values, self._insert_order)

    def session_args(self, record: SessionRecord) -> dict | tuple:
        values = {name: getattr(record, name) for name in _FIELDS}  # field names are column keys
        for name in self._session_json:
            values[name] = to_json(values[name])
        return self._bound(values, self._session_order)

    @staticmethod
    def _bound(values: dict[str, Any], order: Sequence[str] | None) -> dict | tuple:
        return tuple(values[k] for k in order) if order else values


def record_from_row(row: SessionRow) -> SessionRecord:
    return SessionRecord.model_validate({name: getattr(row, _ROW_ATTR.get(name, name)) for name in _FIELDS})


def _turn_values(
    session_id: str, seq: int, turn: TrainingTurn, base: prefix.Base | None
) -> tuple[dict[str, Any], prefix.Base]:
    """The row for a turn (columns by name, JSON serialised), stored against `base` (its prompt ids and
    its messages, where they share any); and the turn as a base for the next."""
    try:
        mask = codec.encode_mask(turn.loss_mask)
        prompt = codec.encode_ids(turn.prompt_token_ids)
        completion = codec.encode_ids(turn.completion_token_ids)
    except StoreError as exc:
        raise StoreError(f"turn {seq} of session {session_id!r}: {exc}") from exc
    shared = prefix.delta(prompt, seq, base)
    messages = compact.messages_of(turn.request)
    n_messages = (
        compact.shared_messages(messages, base.messages) if base is not None and base.seq < seq else 0
    )
    base_seq = shared.base_seq if shared.base_seq is not None or not n_messages else base.seq  # type: ignore[union-attr]
    response, elided = compact.elide_response(
        turn.response, turn.prompt_token_ids, turn.completion_token_ids, turn.per_token_logps
    )
    values = {
        "session_id": session_id,
        "seq": seq,
        "node_id": turn.node_id,
        "prompt_base_seq": base_seq,
        "prompt_shared_len": shared.shared,
        "prompt_ids": shared.suffix,
        "completion_ids": completion,
        "logps": codec.encode_logps(turn.per_token_logps),
        "loss_mask": mask,
        "request": to_json(compact.stored_request(turn.request, n_messages)),
        "response": to_json(response),
        "metadata": to_json(turn.metadata.model_dump()),
        "request_shared": n_messages,
        "response_elided": elided,
    }
    return values, prefix.Base(seq, prompt + completion, messages)


def turns_from_rows(session_id: str, rows: Sequence[TurnRow]) -> list[TrainingTurn]:
    """Rebuild a session's turns from its rows in seq order (each turn's base comes earlier)."""
    needed = {row.prompt_base_seq for row in rows if row.prompt_base_seq is not None}
    messages_needed = {row.prompt_base_seq for row in rows if row.request_shared}
    bases: dict[int, prefix.Base] = {}  # turns that later turns are stored against
    turns = []
    for row in rows:
        base = None
        if row.prompt_base_seq is not None:
            base = bases.get(row.prompt_base_seq)
            if base is None:
                raise StoreError(
                    f"turn {row.seq} of session {session_id!r} is stored against turn "
                    f"{row.prompt_base_seq}, which is not an earlier turn of the session"
                )
        prompt = prefix.rebuild(row.prompt_ids, base.tokens if base else None, row.prompt_shared_len)
        request = row.request
        if row.request_shared:
            try:
                compact.rebuild_messages(
                    request, row.request_shared, base.messages if base else compact.NO_MESSAGES
                )
            except ValueError as exc:
                raise StoreError(f"turn {row.seq} of session {session_id!r}: {exc}") from exc
        if row.seq in needed:
            messages = compact.messages_of(request) if row.seq in messages_needed else compact.NO_MESSAGES
            bases[row.seq] = prefix.Base(row.seq, prompt + row.completion_ids, messages)
        turns.append(_turn(row, prompt, request))
    return turns


def _turn(row: TurnRow, prompt_ids: bytes, request: dict) -> TrainingTurn:
    prompt = codec.decode_ids(prompt_ids)
    completion = codec.decode_ids(row.completion_ids)
    logps = codec.decode_logps(row.logps)
    return TrainingTurn(
        node_id=row.node_id,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        per_token_logps=logps,
        loss_mask=codec.decode_mask(row.loss_mask, len(prompt) + len(completion)),
        request=request,
        response=compact.restore_response(row.response, row.response_elided, prompt, completion, logps),
        metadata=TurnMetadata.model_validate(row.meta),
    )


def _check_transition(session_id: str, current: str, new: str) -> None:
    """running -> any terminal status; a terminal status is final (setting it again is a no-op)."""
    if new != current and current in TERMINAL_STATUSES:
        raise InvalidSessionUpdate(
            f"session {session_id!r} is already {current!r}; it cannot become {new!r} "
            "(a finished session's status is final)"
        )


class TraceStore:
    """Sessions and turns in one database. Thread-safe: every call is its own transaction."""

    def __init__(self, url: str | None = None, *, prompt_cache_mb: float = 64):
        """`prompt_cache_mb`: memory for the last turn of recently written sessions, which new prompts
        are stored against (prefix.py); 0 stores every prompt in full."""
        self.url = url or default_store_url()
        self._bases = prefix.BaseCache(int(prompt_cache_mb * 2**20))
        self._engine = create_store_engine(self.url)
        try:
            upgrade_to_head(self._engine)
        except BaseException:
            self._engine.dispose()
            raise
        # An in-memory SQLite database is one shared connection: take turns on it.
        self._serial: AbstractContextManager[Any] = (
            threading.RLock() if isinstance(self._engine.pool, StaticPool) else nullcontext()
        )
        self._sql = _RawSQL(self._engine)
        # A SQLite file has one writer at a time anyway: the per-call writes (`_write_raw`) share one
        # connection, kept for the store's life, instead of a pool checkout and reset per commit
        # (~45 us a call, measured in the proxy). Other databases write concurrently on pooled ones.
        self._raw_lock = threading.Lock()
        self._raw_conn: Any = None
        self._hold_raw_conn = self._engine.dialect.name == "sqlite" and not isinstance(
            self._engine.pool, StaticPool
        )
        self._read = sessionmaker(self._engine, expire_on_commit=False)
        self._write = sessionmaker(
            self._engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False
        )

    def __repr__(self) -> str:
        return f"TraceStore({redact(self.url)!r})"

    @property
    def server_locks(self) -> ServerLocks:
        """Which `harbor serve` holds which server id on this store (server_locks.py)."""
        return ServerLocks(self._transaction)

    @property
    def is_sqlite(self) -> bool:
        """Whether the database is SQLite: its commits are local C calls, with no network to wait on."""
        return self._engine.dialect.name == "sqlite"

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Session]:
        """One transaction; database errors leave as StoreError naming the store."""
        try:
            with self._serial, (self._write if write else self._read)() as session, session.begin():
                yield session
        except StoreError:
            raise
        except SQLAlchemyError as exc:
            if isinstance(getattr(exc, "orig", None), StoreError):  # raised by our JSON serializer
                raise exc.orig from exc
            raise self._failed(exc) from exc

    def _failed(self, exc: BaseException) -> StoreError:
        """A database or driver error as the StoreError that names this store."""
        return StoreError(f"trace store {redact(self.url)}: {type(exc).__name__}: {exc}")

    # Sessions

    def create_session(self, record: SessionRecord) -> None:
        """Insert a new session; its id and key hash must be unused, and it starts with no turns."""
        if record.num_turns != 0:
            raise StoreError(
                f"cannot create session {record.session_id!r} with num_turns={record.num_turns}: "
                "the store counts turns as they are added"
            )
        sql = self._sql
        try:
            self._write_raw(lambda cursor: cursor.execute(sql.insert_session, sql.session_args(record)))
        except sql.integrity as exc:
            raise StoreError(
                f"cannot create session {record.session_id!r}: its id or key hash is already in use"
            ) from exc
        except (sql.errors, SQLAlchemyError) as exc:  # the driver's, or the pool's
            raise self._failed(exc) from exc

    def get_session(self, session_id: str) -> SessionRecord:
        with self._transaction(write=False) as s:
            row = s.get(SessionRow, session_id)
            if row is None:
                raise SessionNotFound(session_id)
            return record_from_row(row)

    def find_session_by_key_hash(self, key_hash: str) -> SessionRecord | None:
        with self._transaction(write=False) as s:
            row = s.scalars(select(SessionRow).where(SessionRow.api_key_hash == key_hash)).one_or_none()
            return None if row is None else record_from_row(row)

    def list_sessions(
        self,
        *,
        status: SessionStatus | Collection[SessionStatus] | None = None,
        purpose: str | None = None,
        task_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[SessionRecord]:
        """Sessions newest first; `status` is one status or several."""
        if limit < 0 or offset < 0:
            raise ValueError(f"limit and offset must be >= 0, got limit={limit}, offset={offset}")
        query = select(SessionRow)
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            query = query.where(SessionRow.status.in_(statuses))
        if purpose is not None:
            query = query.where(SessionRow.purpose == purpose)
        if task_id is not None:
            query = query.where(SessionRow.task_id == task_id)
        query = query.order_by(SessionRow.created_at.desc(), SessionRow.session_id.desc())
        with self._transaction(write=False) as s:
            return [record_from_row(row) for row in s.scalars(query.limit(limit).offset(offset))]

    def update_session(self, session_id: str, /, **fields: Any) -> SessionRecord:
        """Change some fields and return the updated record.

        Unknown or store-managed field names raise InvalidSessionUpdate, as does leaving a terminal
        status. Moving to a terminal status stamps `finished_at` unless it is given.
        """
        bad = sorted(set(fields) - _UPDATABLE)
        if bad:
            raise InvalidSessionUpdate(
                f"cannot update field(s) {bad} of session {session_id!r}; updatable: {sorted(_UPDATABLE)}"
            )
        with self._transaction(write=True) as s:
            row = s.get(SessionRow, session_id, with_for_update=True)
            if row is None:
                raise SessionNotFound(session_id)
            current = record_from_row(row)
            new_status = fields.get("status", current.status)
            _check_transition(session_id, current.status, new_status)
            if new_status != current.status and new_status in TERMINAL_STATUSES:
                fields.setdefault("finished_at", time.time())
            try:
                updated = SessionRecord.model_validate(current.model_dump() | fields)
            except ValueError as exc:
                raise InvalidSessionUpdate(f"invalid update of session {session_id!r}: {exc}") from exc
            for name in fields:
                setattr(row, _ROW_ATTR.get(name, name), getattr(updated, name))
        if updated.status in TERMINAL_STATUSES:
            self._bases.drop(session_id)  # no more turns expected
        return updated

    def mark_running_failed(self, reason: str, *, owner: str | None = None) -> int:
        """After a crash or restart, mark the sessions a writer left `running` failed; returns how many.

        `owner`: only that owner's sessions, and those with no owner recorded (written before owners
        were, or by a writer that names none), so a server starting on a store other servers share
        leaves their live sessions alone. None: every running session (a store with one writer).
        """
        query = update(SessionRow).where(SessionRow.status == "running")
        if owner is not None:
            query = query.where(or_(SessionRow.owner == owner, SessionRow.owner.is_(None)))
        with self._transaction(write=True) as s:
            result = s.execute(
                query.values(status="failed", error=reason, finished_at=time.time()).execution_options(
                    synchronize_session=False
                )
            )
            return result.rowcount

    # Turns

    def add_turns(self, items: Sequence[tuple[str, int, TrainingTurn]]) -> None:
        """Store (session_id, seq, turn) items in ONE transaction: all of them, or none."""
        if not items:
            return
        rows = []
        staged: dict[str, prefix.Base] = {}  # the newest turn per session once this batch commits
        for session_id, seq, turn in items:
            base = staged.get(session_id) or self._bases.get(session_id)
            values, as_base = _turn_values(session_id, seq, turn, base)
            rows.append(values)
            if base is None or seq > base.seq:
                staged[session_id] = as_base
        per_session = Counter(session_id for session_id, _, _ in items)
        try:
            self._insert_turns(per_session, rows)
        except BaseException as exc:
            for session_id in staged:  # a failed batch may have been built on a base that is gone
                self._bases.drop(session_id)
            if isinstance(exc, self._sql.integrity):
                keys = ", ".join(f"{sid!r} seq {seq}" for sid, seq, _ in items[:5])
                more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
                raise TurnExists(
                    f"a turn with the same (session, seq) is already stored among: {keys}{more}"
                ) from exc
            if isinstance(exc, self._sql.errors | SQLAlchemyError):  # the driver's, or the pool's
                raise self._failed(exc) from exc
            raise
        for session_id, base in staged.items():  # committed: later turns may share from these
            self._bases.put(session_id, base)

    def _insert_turns(self, per_session: Counter[str], rows: list[dict[str, Any]]) -> None:
        """Bump each session's count and insert the rows, in one transaction.

        The UPDATEs go in session-id order and lock each session row (PostgreSQL; SQLite holds the
        write lock already), so concurrent writers never deadlock and a session cannot vanish under
        us; an UPDATE that matches no row is an unknown session.
        """
        sql = self._sql

        def work(cursor: Any) -> None:
            for session_id in sorted(per_session):
                cursor.execute(sql.bump, sql.bump_args(session_id, per_session[session_id]))
                if cursor.rowcount != 1:
                    raise SessionNotFound(session_id)
            if len(rows) == 1:
                cursor.execute(sql.insert, sql.insert_args(rows[0]))
            else:
                cursor.executemany(sql.insert, [sql.insert_args(row) for row in rows])

        self._write_raw(work)

    def _write_raw(self, work: Callable[[Any], None]) -> None:
        """`work(cursor)` in one transaction on a raw DBAPI connection (`_raw_connection`); the
        driver's errors pass through as they are."""
        sql = self._sql
        with self._serial, self._raw_connection() as conn:
            try:
                cursor = conn.cursor()
                if sql.begin:
                    cursor.execute(sql.begin)
                work(cursor)
                cursor.close()
                conn.commit()
            except BaseException:
                try:
                    conn.rollback()
                except Exception:  # the connection itself is broken: never hand it out again
                    conn.invalidate()
                raise

    @contextmanager
    def _raw_connection(self) -> Iterator[Any]:
        """The raw DBAPI connection `_write_raw` runs on: the store's own for a SQLite file (dropped
        once invalidated), a pooled one otherwise."""
        if not self._hold_raw_conn:
            conn = self._engine.raw_connection()
            try:
                yield conn
            finally:
                conn.close()
            return
        with self._raw_lock:
            if self._raw_conn is None:
                self._raw_conn = self._engine.raw_connection()
            try:
                yield self._raw_conn
            finally:
                if not self._raw_conn.is_valid:
                    self._raw_conn.close()
                    self._raw_conn = None

    def add_turn(self, session_id: str, seq: int, turn: TrainingTurn) -> None:
        self.add_turns([(session_id, seq, turn)])

    def get_turns(self, session_id: str) -> list[TrainingTurn]:
        """The session's turns ordered by seq, exactly as they were stored."""
        with self._transaction(write=False) as s:
            if not s.scalar(select(exists().where(SessionRow.session_id == session_id))):
                raise SessionNotFound(session_id)
            rows = s.scalars(select(TurnRow).where(TurnRow.session_id == session_id).order_by(TurnRow.seq))
            return turns_from_rows(session_id, rows.all())

    def close(self) -> None:
        with self._raw_lock:
            if self._raw_conn is not None:
                self._raw_conn.close()
                self._raw_conn = None
        self._engine.dispose()
