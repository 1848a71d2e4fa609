"""The one module that talks to Postgres at run time (migrations aside).

It runs the named statements of engine/sql/, turns rows into the frozen dataclasses of
engine/model.py and psycopg errors into skiplock errors. Every other module calls it.
Creating a Store opens nothing; `open()` starts the pool.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import random
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import psycopg
import psycopg.adapt
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from . import queries
from .errors import (
    DatabaseUnavailable,
    InvalidInput,
    MigrationError,
    PayloadTooLarge,
    ScheduleNotFound,
    WebhookNotFound,
    DeliveryNotFound,
    IdempotencyConflict,
    TaskNotCancellable,
    TaskNotFound,
    TaskNotResumable,
)
from .model import AuditEntry, ClaimedTask, Settlement, Task, TaskEvent, uuid7
from .schedules import Schedule, ScheduleStatus, TickPlan, idempotency_key
from .settings import check_name

log = logging.getLogger("skiplock.store")

# libpq keepalives: a silently dead peer (half-open TCP) is noticed in about a minute.
KEEPALIVES = dict(keepalives=1, keepalives_idle=20, keepalives_interval=5, keepalives_count=3,
                  tcp_user_timeout=30_000)


def connect(url: str, *, autocommit: bool = True, **kwargs) -> psycopg.Connection:
    """A connection of our own (listener, migrations, one-off enqueue)."""
    try:
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=10, **KEEPALIVES, **kwargs)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to Postgres: {exc}".strip()) from exc


@contextmanager
def translated_errors():
    """psycopg errors a caller can act on, as skiplock errors: a lost or refused connection, and
    a database whose skiplock schema was never migrated."""
    try:
        yield
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrationError(f"the skiplock schema is missing ({first}): run `skiplock migrate`") from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(str(exc).strip() or type(exc).__name__) from exc


# ---- enqueue ---------------------------------------------------------------------------------

class TaskSpec:
    """One task to enqueue, validated on construction."""

    __slots__ = ("kind", "payload", "queue", "priority", "max_attempts", "delay", "run_at",
                 "idempotency_key", "payload_json", "max_payload_bytes")

    def __init__(self, kind: str, payload: Any = None, *, queue: str = "default", priority: int = 0,
                 run_at: dt.datetime | None = None, delay: float | None = None,
                 idempotency_key: str | None = None, max_attempts: int | None = None,
                 max_payload_bytes: int = 1024 * 1024):
        check_name("task kind", kind)
        check_name("queue", queue)
        if isinstance(priority, bool) or not isinstance(priority, int) or not -32768 <= priority <= 32767:
            raise InvalidInput(f"priority {priority!r}: must be an integer in [-32768, 32767]")
        if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                         or max_attempts < 1):
            raise InvalidInput(f"max_attempts {max_attempts!r}: must be a positive integer")
        if run_at is not None and delay is not None:
            raise InvalidInput("give either run_at or delay, not both")
        if run_at is not None and (not isinstance(run_at, dt.datetime) or run_at.tzinfo is None):
            raise InvalidInput(f"run_at {run_at!r}: must be a timezone-aware datetime")
        if delay is not None:
            if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not delay >= 0:
                raise InvalidInput(f"delay {delay!r}: must be a number of seconds >= 0")
        _check_key(idempotency_key)
        self.kind, self.queue, self.priority = kind, queue, priority
        self.max_attempts, self.delay, self.run_at = max_attempts, delay, run_at
        self.idempotency_key = idempotency_key
        self.payload, self.payload_json = payload, encode_payload(payload, max_payload_bytes)
        self.max_payload_bytes = max_payload_bytes

    def with_payload(self, payload: Any, idempotency_key: str | None = None) -> "TaskSpec":
        """Another task like this one (bulk enqueue validates the shared fields once)."""
        _check_key(idempotency_key)
        spec = object.__new__(TaskSpec)
        spec.kind, spec.queue, spec.priority = self.kind, self.queue, self.priority
        spec.max_attempts, spec.delay, spec.run_at = self.max_attempts, self.delay, self.run_at
        spec.max_payload_bytes = self.max_payload_bytes
        spec.idempotency_key = idempotency_key
        spec.payload, spec.payload_json = payload, encode_payload(payload, self.max_payload_bytes)
        return spec


# One encoder for every payload: json.dumps() with options builds a new encoder per call.
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# ... and JSONEncoder.encode() still builds its C encoder per call (about 0.8 µs of a payload's
# 1.3 µs), so build that once, where the C accelerator exists. Without the circular-reference
# markers, it holds no state between calls (safe to share between threads); a circular payload
# ends in RecursionError instead of ValueError.
_JSON_C = (json.encoder.c_make_encoder(None, _JSON.default, json.encoder.encode_basestring_ascii, None,
                                       _JSON.key_separator, _JSON.item_separator, False, False, False)
           if json.encoder.c_make_encoder is not None else None)


def _dumps(value: Any) -> str:
    if _JSON_C is None:
        return _JSON.encode(value)
    return "".join(_JSON_C(value, 0))


def _check_key(key: str | None) -> None:
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 255):
        raise InvalidInput("idempotency_key: must be a string of 1-255 characters")


def encode_payload(payload: Any, max_bytes: int) -> str:
    """The payload as compact JSON text, or InvalidInput/PayloadTooLarge saying why not."""
    try:
        encoded = _dumps({} if payload is None else payload)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"payload is not JSON-serializable: {exc}") from exc
    except RecursionError:
        raise InvalidInput("payload is not JSON-serializable: it refers to itself, or nests too deep") from None
    if "\\u0000" in encoded:
        raise InvalidInput("payload contains a NUL character (\\u0000), which Postgres jsonb cannot store")
    size = len(encoded) if encoded.isascii() else len(encoded.encode("utf-8"))
    if size > max_bytes:
        raise PayloadTooLarge(f"payload is {size} bytes; the limit is {max_bytes} (SKIPLOCK_MAX_PAYLOAD_BYTES)")
    return encoded


def check_schedule_payloads(schedules: Sequence[Schedule], max_bytes: int) -> None:
    """Refuse, naming the schedule, a payload the enqueue limit would refuse: at apply time
    (and in a dry run), not at every fire."""
    for s in schedules:
        try:
            encode_payload(s.payload, max_bytes)
        except InvalidInput as exc:
            raise type(exc)(f"schedule {s.name!r}: {exc}") from None


class _RawJson(Jsonb):
    """Already-encoded JSON text, passed through without a second dumps()."""

    def __init__(self, text: str):
        super().__init__(text, dumps=lambda text: text)


def insert_tasks(conn: psycopg.Connection, specs: Sequence[TaskSpec], schema: str = "skiplock") -> list[uuid.UUID]:
    """Insert tasks on `conn`, inside whatever transaction it is in. Returns one id per spec, in
    order; a spec whose idempotency key is taken gets the existing task's id. The database writes
    their 'queued' events and wakes the workers (the tasks_inserted trigger)."""
    if not specs:
        return []
    sql = queries.load(schema)
    ids = uuid7.many(len(specs))
    if len(specs) >= COPY_THRESHOLD and all(
            s.idempotency_key is None and s.delay is None and s.run_at is None for s in specs):
        texts = [u.hex for u in ids]  # Postgres reads a uuid without dashes too
        _copy_in(conn, ("".join(map(_copy_line, texts[i:j], specs[i:j])) for i, j in _pieces(len(specs))), sql)
        return ids
    if len(specs) == 1:  # the common single enqueue: plain parameters, no arrays to build and unnest
        s = specs[0]
        statement, params = sql["task_insert_one"], dict(
            id=ids[0], kind=s.kind, queue=s.queue, priority=s.priority, payload=_RawJson(s.payload_json),
            max_attempts=s.max_attempts, delay=s.delay, run_at=s.run_at, idempotency_key=s.idempotency_key)
    else:
        statement, params = sql["task_insert"], dict(
            ids=ids,
            kinds=[s.kind for s in specs],
            queues=[s.queue for s in specs],
            priorities=[s.priority for s in specs],
            payloads=[_RawJson(s.payload_json) for s in specs],
            max_attempts=[s.max_attempts for s in specs],
            delays=[s.delay for s in specs],
            run_ats=[s.run_at for s in specs],
            idempotency_keys=[s.idempotency_key for s in specs],
        )
    with translated_errors():
        inserted = {row[0] for row in conn.execute(statement, params).fetchall()}
        keyed = [i for i, s in enumerate(specs) if s.idempotency_key is not None and ids[i] not in inserted]
        orphans = []
        if keyed:
            # the key's owner committed before our INSERT (ON CONFLICT waited for it), so this
            # new statement's snapshot sees it
            keys = list({specs[i].idempotency_key for i in keyed})
            existing = dict(conn.execute(sql["task_ids_by_idempotency_key"], {"keys": keys}).fetchall())
            orphans = []
            for i in keyed:
                owner = existing.get(specs[i].idempotency_key)
                if owner is None:
                    # a duplicate key inside this very batch: the first occurrence won
                    owner = next((ids[j] for j in range(i) if specs[j].idempotency_key == specs[i].idempotency_key
                                  and ids[j] in inserted), None)
                if owner is None:
                    orphans.append(i)
                else:
                    ids[i] = owner
        if orphans:
            # the key's task was deleted (retention) between our INSERT and the lookup: the key is
            # free again, so insert these once more
            for i, task_id in zip(orphans, insert_tasks(conn, [specs[i] for i in orphans], schema)):
                ids[i] = task_id
    return ids


# Bulk enqueues of plain tasks (no idempotency key, no delay) this large go through COPY, which
# moves rows about a third faster than INSERT ... SELECT FROM unnest(...).
COPY_THRESHOLD = 64
# Rows per piece of a COPY: Postgres stores one piece while the next is encoded. The first
# pieces are small, so that Postgres starts early; each is encoded (about 2 µs a row) while
# Postgres stores the one before (about 5 µs a row), so doubling never leaves it waiting.
COPY_FIRST_PIECE = 32
COPY_PIECE = 256


def _pieces(n: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each piece of a COPY of n rows: 32, 64, 128, then 256 at a time."""
    start, size = 0, COPY_FIRST_PIECE
    while start < n:
        yield start, min(start + size, n)
        start, size = start + size, min(2 * size, COPY_PIECE)

_COPY_NULL = "\\N"


def _copy_frame(s: TaskSpec) -> tuple[str, str]:
    """A tasks row in COPY text format (the columns of task_copy_in) is id + middle + payload +
    end; this returns (middle, end), the parts taken from `s`."""
    max_attempts = _COPY_NULL if s.max_attempts is None else s.max_attempts
    return f"\t{s.kind}\t{s.queue}\t{s.priority}\t", f"\t{max_attempts}\t1\n"


def _copy_text(payload_json: str) -> str:
    return payload_json.replace("\\", "\\\\")


def _copy_line(task_id: str, s: TaskSpec) -> str:
    middle, end = _copy_frame(s)
    return f"{task_id}{middle}{_copy_text(s.payload_json)}{end}"


def copy_many(conn: psycopg.Connection, template: TaskSpec, payloads: Sequence[Any],
              schema: str = "skiplock") -> list[uuid.UUID]:
    """enqueue_many's common case: plain tasks (no idempotency key, no delay) that differ only in
    their payloads, the other fields taken from `template` (validated once). Each piece's ids are
    made and its payloads encoded and checked as it is written, while Postgres stores the previous
    piece; one refused leaves nothing written."""
    middle, end = _copy_frame(template)
    limit = template.max_payload_bytes
    ids: list[uuid.UUID] = []

    def pieces() -> Iterator[str]:
        for i, j in _pieces(len(payloads)):
            piece = payloads[i:j]
            piece_ids = uuid7.many(len(piece))
            ids.extend(piece_ids)
            yield "".join([f"{task_id.hex}{middle}{_copy_text(encode_payload(p, limit))}{end}"
                           for task_id, p in zip(piece_ids, piece)])

    _copy_in(conn, pieces(), queries.load(schema))
    return ids


def _copy_in(conn: psycopg.Connection, pieces: Iterable[str], sql: dict[str, str]) -> None:
    """COPY the tasks (text format, piece by piece) as one unit, in the caller's transaction if
    it has one; the tasks_inserted trigger writes their events and wakes the workers when the
    COPY ends. Kinds and queues are validated names (no tab, newline or backslash); payloads are
    JSON text, whose only special character for COPY is the backslash of its escapes."""
    with translated_errors(), _unit(conn), conn.cursor().copy(sql["task_copy_in"]) as copy:
        for piece in pieces:  # an error here (a payload refused) aborts the COPY
            copy.write(piece.encode())


@contextmanager
def _unit(conn: psycopg.Connection) -> Iterator[None]:
    """All or nothing for the one COPY statement inside: on an autocommit connection outside a
    transaction, the statement is its own transaction (its trigger's writes included), so it
    needs no BEGIN and COMMIT of ours; else a savepoint in the caller's transaction (begun by it
    if need be), so that an error inside (a payload refused during the COPY) leaves the caller's
    transaction as it was, and usable."""
    if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        yield
        return
    # not conn.transaction(): on a connection idle outside a transaction, it would commit
    conn.execute("SAVEPOINT skiplock_enqueue")
    try:
        yield
    except BaseException:
        try:
            conn.execute("ROLLBACK TO SAVEPOINT skiplock_enqueue")
        except psycopg.Error:
            pass  # the connection itself is broken: the original error says why
        raise
    conn.execute("RELEASE SAVEPOINT skiplock_enqueue")


# ---- the store -------------------------------------------------------------------------------

_SETTLEMENT_OPTIONAL = ("result", "error", "delay", "cursor", "progress", "message", "deadline_seconds",
                        "kind_max_attempts", "traceback")
assert _SETTLEMENT_OPTIONAL == Settlement._fields[3:]  # _settle_params reads them by position
_NO_OPTIONALS = (None,) * len(_SETTLEMENT_OPTIONAL)


def _use_generic_plans(conn: psycopg.Connection) -> None:
    """The worker's claim and settle statements (task_claim, task_settle) are built so
    that their best plan does not depend on their parameters or on the table's size: per-row
    primary-key probes, an ordered scan of tasks_claimable, a TID scan. Left to itself, Postgres
    plans them anew on every call (with an unknown LIMIT, the generic plan's estimate looks worse
    than the custom plans'), and planning is about a tenth of its CPU per task in a drain. So on
    these connections, which run only those statements, each is planned once (psycopg prepares
    it from its sixth use), without hash or merge joins or sequential scans, so that a plan made
    while the table was small stays right when it is large. tests/integration/test_claims.py
    checks the plans."""
    conn.execute("SET plan_cache_mode = force_generic_plan; SET enable_hashjoin = off; "
                 "SET enable_mergejoin = off; SET enable_seqscan = off")


class _JsonbLoader(psycopg.adapt.Loader):
    """jsonb text to Python, straight through json's C scanner: json.loads() spends about 1.4 of
    its 1.7 µs on a small payload checking its argument and detecting the bytes' encoding. Used
    on the claims connection, which loads one payload per claimed task."""

    _scan = json.decoder.JSONDecoder().scan_once  # the C scanner, where there is one

    def load(self, data: Any) -> Any:
        text = str(data, "utf-8")
        try:
            value, end = self._scan(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):  # not one whole JSON value (never from Postgres): json says why
            return json.loads(text)
        return value


def _jsonb(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


class Store:
    """Pooled access for the roles. Thread-safe: each call borrows a connection."""

    def __init__(self, url: str, schema: str = "skiplock", *, min_size: int = 1, max_size: int = 8,
                 name: str = "skiplock", worker_connections: bool = False):
        """`worker_connections`: give claim() and settle() a connection each of their own (a
        worker claims on one while its writer writes outcomes on the other), on which those
        statements run with generic plans (see _use_generic_plans). Without: they share the pool."""
        self.url = url
        self.schema = schema
        self.channel = f"skiplock_{schema}"
        self.sql = queries.load(schema)
        kwargs = dict(autocommit=True, connect_timeout=10, application_name=f"skiplock-{name}", **KEEPALIVES)
        self._pool = ConnectionPool(url, min_size=min_size, max_size=max_size, open=False, name=name,
                                    timeout=15, kwargs=kwargs, reconnect_timeout=0)
        self._claim_pool = self._outcome_pool = None
        if worker_connections:
            self._claim_pool, self._outcome_pool = (
                ConnectionPool(url, min_size=1, max_size=1, open=False, name=f"{name}-{use}", timeout=15,
                               reconnect_timeout=0, configure=functools.partial(self._configure_worker_connection, use),
                               num_workers=1, kwargs={**kwargs, "application_name": f"skiplock-{name}-{use}"})
                for use in ("claims", "outcomes"))

    def _configure_worker_connection(self, use: str, conn: psycopg.Connection) -> None:
        """A new claims or outcomes connection: generic plans, then one run of its statement that
        touches nothing (a claim of 0 tasks; the outcome of a task that does not exist). A new
        backend's first run of one of these statements reads its catalogs and plans it: 3 ms for
        the claim, 4-5 ms for the settle here. Done in the pool's thread while the worker starts
        (and after a reconnect, before the connection is lent), it is off the first claim's path."""
        _use_generic_plans(conn)
        if use == "claims":
            conn.adapters.register_loader("jsonb", _JsonbLoader)
            statement, params = "task_claim", dict(queues=["default"], limit=0, owner="", lease_seconds=1.0,
                                                   kind_max_attempts=None)
        else:
            statement = "task_settle"
            params = {"settlements": Jsonb([{"id": uuid7().hex, "token": 0, "outcome": "completed"}])}
        try:
            conn.execute(self.sql[statement], params)
        except psycopg.DatabaseError as exc:  # not fatal: the real statement will say what is wrong
            log.debug("warming up the %s connection failed", use, extra={"error": str(exc)})

    def _pools(self) -> list[ConnectionPool]:
        return [p for p in (self._claim_pool, self._outcome_pool, self._pool) if p is not None]

    def open(self, wait: bool = False) -> "Store":
        for pool in reversed(self._pools()):
            pool.open(wait=wait, timeout=15)
        return self

    def close(self) -> None:
        for pool in self._pools():
            pool.close(timeout=5)

    @contextmanager
    def connection(self, timeout: float | None = None, *, pool: ConnectionPool | None = None):
        """Borrow a pooled connection (waiting up to `timeout`, default the pool's 15 s);
        connection trouble surfaces as DatabaseUnavailable."""
        try:
            with translated_errors(), (pool or self._pool).connection(timeout=timeout) as conn:
                yield conn
        except PoolTimeout as exc:
            raise DatabaseUnavailable(f"no database connection available: {exc}") from exc

    def _fetch(self, name: str, params: dict, *, pool: ConnectionPool | None = None) -> list[tuple]:
        with self.connection(pool=pool) as conn:
            return conn.execute(self.sql[name], params).fetchall()

    # -- health
    def ping(self, timeout: float | None = None) -> None:
        with self.connection(timeout) as conn:
            conn.execute("SELECT 1")

    # -- enqueue
    def enqueue(self, specs: Sequence[TaskSpec]) -> list[uuid.UUID]:
        with self.connection() as conn:
            with conn.transaction():
                return insert_tasks(conn, specs, self.schema)

    # -- worker
    def claim(self, queues: Sequence[str], limit: int, owner: str, lease_seconds: float,
              kind_max_attempts: Mapping[str, int] | None = None) -> list[ClaimedTask]:
        """Lease up to `limit` claimable tasks of `queues` (on the claims connection, if this store
        has worker connections). A claimed task without max_attempts of its own gets its kind's
        from `kind_max_attempts` ({kind: max_attempts}), if there."""
        rows = self._fetch("task_claim", dict(queues=list(queues), limit=limit, owner=owner,
                                              lease_seconds=lease_seconds,
                                              kind_max_attempts=_jsonb(kind_max_attempts)),
                           pool=self._claim_pool)
        return [ClaimedTask._make(row) for row in rows]

    def heartbeat(self, leases: Iterable[tuple[uuid.UUID, int]], lease_seconds: float) -> dict[uuid.UUID, str]:
        """Renew claims; returns {task id: state} for the claims still held."""
        leases = list(leases)
        if not leases:
            return {}
        rows = self._fetch("task_heartbeat", dict(ids=[i for i, _ in leases], tokens=[t for _, t in leases],
                                                  lease_seconds=lease_seconds))
        return dict(rows)

    def settle(self, settlements: Sequence[Settlement], conn: psycopg.Connection | None = None
               ) -> dict[uuid.UUID, str]:
        """Apply fenced outcomes, many in one statement (on `conn`, else on the outcomes
        connection if this store has worker connections); returns {task id: new state} for those
        applied. A settlement missing from the result was refused by its fence."""
        if not settlements:
            return {}
        params = self._settle_params(settlements)
        if conn is not None:
            return dict(conn.execute(self.sql["task_settle"], params).fetchall())
        return dict(self._fetch("task_settle", params, pool=self._outcome_pool))

    @staticmethod
    def _settle_params(settlements: Sequence[Settlement]) -> dict:
        rows = []
        optional = _SETTLEMENT_OPTIONAL
        for s in settlements:
            # the id as 32 hex digits (a third of str()'s cost; Postgres reads it as a uuid)
            row = {"id": s.task_id.hex, "token": s.lease_token, "outcome": s.outcome}
            if s[3:] != _NO_OPTIONALS:  # the common completion, with no result, has none
                for name, value in zip(optional, s[3:]):  # the fields after outcome, in order
                    if value is not None:
                        row[name] = value
            rows.append(row)
        return {"settlements": Jsonb(rows)}

    def reclaim_expired(self, max_reclaims: int, limit: int = 500) -> list["ReclaimedTask"]:
        """The reaper's unit of work: each claim it took back, with the state it left it in."""
        rows = self._fetch("task_reclaim_expired", dict(limit=limit, max_reclaims=max_reclaims,
                                                        channel=self.channel))
        return [ReclaimedTask(*r[:6]) for r in rows]

    # -- operator actions
    def get(self, task_id: uuid.UUID | str) -> Task:
        task_id = _parse_id(task_id)
        rows = self._fetch("task_get", {"id": task_id})
        if not rows:
            raise TaskNotFound(f"task {task_id} not found")
        return Task(*rows[0])

    def events(self, task_id: uuid.UUID | str) -> list[TaskEvent]:
        return [TaskEvent(*row) for row in self._fetch("task_events_list", {"id": _parse_id(task_id)})]

    def cancel(self, task_id: uuid.UUID | str, data: dict | None = None) -> str:
        task_id = _parse_id(task_id)
        rows = self._fetch("task_cancel", {"id": task_id, "data": _jsonb(data)})
        if rows:
            return rows[0][1]
        state = self.get(task_id).state  # raises TaskNotFound
        if state in ("cancelling", "cancelled"):
            return state  # already asked: cancelling twice is not an error
        # the task finished before the request arrived
        raise TaskNotCancellable(f"task {task_id} is {state}; only queued or running tasks can be cancelled")

    def resume(self, task_id: uuid.UUID | str, data: dict | None = None) -> str:
        task_id = _parse_id(task_id)
        rows = self._fetch("task_resume", {"id": task_id, "data": _jsonb(data), "channel": self.channel})
        if rows:
            return rows[0][1]
        state = self.get(task_id).state
        raise TaskNotResumable(f"task {task_id} is {state}; only failed or cancelled tasks can be resumed")

    # -- bulk operator actions: the tasks of a filter, in batches of short transactions
    def cancel_many(self, task_filter: dict, limit: int, data: dict | None = None, **batching) -> int:
        """Cancel up to `limit` queued or running tasks of `task_filter` (the keyword arguments of
        list_tasks but cursor and limit), as cancel() does each; returns how many changed."""
        return self._many("task_cancel_many", {**task_filter, "data": _jsonb(data)}, limit, **batching)

    def retry_many(self, task_filter: dict, limit: int, data: dict | None = None, **batching) -> int:
        """Resume up to `limit` failed or cancelled tasks of `task_filter`, as resume() does each."""
        return self._many("task_retry_many", {**task_filter, "data": _jsonb(data), "channel": self.channel},
                          limit, **batching)

    def purge_many(self, task_filter: dict, limit: int, **batching) -> int:
        """Delete up to `limit` finished tasks of `task_filter` with their events."""
        return self._many("task_purge_many", dict(task_filter), limit, **batching)

    def _many(self, name: str, params: dict, limit: int, *, batch_size: int = 500,
              last: Callable[["Store", int], None] | None = None) -> int:
        """Run a `*_many` statement in transactions of at most `batch_size` rows until `limit` rows
        changed or a batch comes back short. `last(tx, total)` runs in the last batch's transaction
        (an audit row then commits with the batch that ends the action)."""
        params = {**params, "ids": _id_list(params.get("ids"))}
        total = 0
        while True:
            size = min(batch_size, limit - total)
            with self.transaction() as tx:
                changed = len(tx._fetch(name, {**params, "limit": size}))
                total += changed
                # short: nothing more matches, or the rest is locked right now (a repeat gets it)
                done = changed < size or total >= limit
                if done and last is not None:
                    last(tx, total)
            if done:
                return total

    def pauses(self) -> list[tuple[str, str, dt.datetime]]:
        return self._fetch("pause_list", {})

    def pause(self, scope: str, name: str) -> None:
        with self.connection() as conn:
            conn.execute(self.sql["pause_set"], {"scope": scope, "name": name})

    def unpause(self, scope: str, name: str) -> None:
        self._fetch("pause_clear", {"scope": scope, "name": name, "channel": self.channel})

    # -- api
    @contextmanager
    def transaction(self) -> Iterator["Store"]:
        """A store whose every call runs on one connection, in one transaction that commits when
        the block ends (rolls back if it raises). The API commits a change and its audit row
        this way. A method that opens a transaction of its own runs in a savepoint of this one."""
        with self.connection() as conn, conn.transaction():
            yield _BoundStore(self, conn)

    def submit(self, specs: Sequence[TaskSpec], fingerprints: Sequence[str | None],
               deadlines: Sequence[dt.datetime | None]) -> list[tuple[uuid.UUID, bool]]:
        """Enqueue API submissions; returns (task id, created) per spec, in order.

        Call it on the store `transaction()` yields, at the top level of that transaction (not in
        a savepoint): whether a keyed task is this request's own is read from the row's xmin.
        A key that names a task submitted with the same fingerprint is a replay (created False);
        with another fingerprint it is IdempotencyConflict, and nothing of this call remains."""
        with self.connection() as conn:
            ids = insert_tasks(conn, specs, self.schema)
            created = [True] * len(specs)
            keyed = [i for i, s in enumerate(specs) if s.idempotency_key is not None]
            if keyed:
                rows = {row[0]: row[1:] for row in conn.execute(
                    self.sql["task_submitted"], {"ids": [ids[i] for i in keyed]}).fetchall()}
                first: dict[uuid.UUID, int] = {}
                for i in keyed:
                    key = specs[i].idempotency_key
                    if ids[i] not in rows:
                        # retention deleted the key's task between our insert and this read
                        raise IdempotencyConflict(f"Idempotency-Key {key!r}: its task was just deleted; retry")
                    request_hash, mine, *stored = rows[ids[i]]
                    if mine and ids[i] not in first:
                        first[ids[i]] = i
                        continue
                    created[i] = False
                    if mine:  # the key twice in one batch: the first occurrence made the task
                        same = fingerprints[first[ids[i]]] == fingerprints[i]
                    elif request_hash is not None:
                        same = request_hash == fingerprints[i]
                    else:  # enqueued by the library or the CLI: compare what both have
                        s = specs[i]
                        same = tuple(stored) == (s.kind, s.queue, s.priority, s.payload if s.payload is not None
                                                 else {}, s.max_attempts)
                    if not same:
                        raise IdempotencyConflict(f"Idempotency-Key {key!r} was used for task {ids[i]} "
                                                  "with a different body")
            annotate = [i for i, s in enumerate(specs) if created[i]
                        and (deadlines[i] is not None or (s.idempotency_key is not None and fingerprints[i]))]
            if annotate:
                conn.execute(self.sql["task_annotate"], dict(
                    ids=[ids[i] for i in annotate], hashes=[fingerprints[i] for i in annotate],
                    deadlines=[deadlines[i] for i in annotate]))
        return list(zip(ids, created))

    def list_tasks(self, *, queue: str | None = None, state: str | None = None, kind: str | None = None,
                   created_after: dt.datetime | None = None, created_before: dt.datetime | None = None,
                   ids: Sequence[uuid.UUID] | None = None, idempotency_key: str | None = None,
                   cursor: uuid.UUID | None = None, limit: int = 50) -> list[Task]:
        """Newest first; `cursor` is the id of the last task of the previous page."""
        rows = self._fetch("task_list", dict(queue=queue, state=state, kind=kind, created_after=created_after,
                                             created_before=created_before, ids=_id_list(ids),
                                             idempotency_key=idempotency_key, cursor=cursor, limit=limit))
        return [Task(*row) for row in rows]

    def lock_schedule(self, name: str) -> None:
        """Hold a schedule's row until the transaction ends (call on `transaction()`'s store)."""
        if not self._fetch("schedule_lock", {"name": name}):
            raise ScheduleNotFound(f"schedule {name!r} not found")

    def audit(self, *, actor: str, action: str, target: str | None, request_id: str | None,
              outcome: str, detail: dict | None = None) -> int:
        """Append an audit row; on `transaction()`'s store it commits with the change it records."""
        return self._fetch("audit_insert", dict(actor=actor, action=action, target=target, request_id=request_id,
                                                outcome=outcome, detail=_jsonb(detail)))[0][0]

    def audit_entries(self, *, action: str | None = None, actor: str | None = None, target: str | None = None,
                      cursor: int | None = None, limit: int = 50) -> list[AuditEntry]:
        """Newest first; `cursor` is the id of the last entry of the previous page."""
        rows = self._fetch("audit_list", dict(action=action, actor=actor, target=target, cursor=cursor,
                                              limit=limit))
        return [AuditEntry(*row) for row in rows]

    # -- schedules
    def fire_due_schedules(self, decide: Callable[[Schedule, dict, dt.datetime], TickPlan], *,
                           now: dt.datetime | None = None, limit: int = 50,
                           max_payload_bytes: int = 1024 * 1024) -> list["FiredSchedule"]:
        """One scheduler tick, in one transaction: lock the due schedule rows (skipping those
        another replica holds), let `decide(schedule, row_state, now)` plan each, then enqueue
        the fires, record every decision and advance the rows. A crash anywhere rolls it all back.

        `now` pins the database's clock for tests; by default time is the database's now()."""
        results = []
        with self.connection() as conn, conn.transaction():
            now = conn.execute(self.sql["schedule_now"], {"now": now}).fetchone()[0]
            rows = conn.execute(self.sql["schedule_claim_due"], {"now": now, "limit": limit}).fetchall()
            for row in rows:
                name = row[0]
                state = dict(next_fire_at=row[13], buffered_fire_at=row[14], last_task_id=row[15],
                             previous_state=row[16])
                try:
                    # a savepoint per schedule: one that cannot fire leaves the others' fires intact
                    with conn.transaction():
                        schedule = Schedule(*row[:13], enabled=True)
                        plan = decide(schedule, state, now)
                        results.append(self._apply_tick(conn, schedule, state, plan, now, max_payload_bytes))
                except InvalidInput as exc:
                    # edited in the table by hand, a time zone this tzdata lacks, a payload over
                    # SKIPLOCK_MAX_PAYLOAD_BYTES: logged and looked at again in a minute, instead of
                    # failing every other schedule's tick
                    log.error("schedule cannot fire; retried in a minute", extra={"schedule": name, "error": str(exc)})
                    conn.execute(self.sql["schedule_postpone"], {"name": name, "now": now})
        return results

    def _apply_tick(self, conn: psycopg.Connection, schedule: Schedule, state: dict, plan: TickPlan,
                    now: dt.datetime, max_payload_bytes: int) -> "FiredSchedule":
        previous = state["last_task_id"]
        fired = []
        template = TaskSpec(schedule.kind, schedule.payload, queue=schedule.queue, priority=schedule.priority,
                            max_attempts=schedule.max_attempts, max_payload_bytes=max_payload_bytes)
        nominal_ats, outcomes, task_ids, details = [], [], [], []
        for fire in plan.fires:
            if fire.cancel_previous and previous is not None:
                conn.execute(self.sql["task_cancel"], {"id": previous, "data": Jsonb(
                    {"reason": f"schedule {schedule.name} fired again (overlap cancel_previous)"})})
            spec = template.with_payload(schedule.payload, idempotency_key(schedule.name, fire.nominal_at))
            if schedule.jitter_seconds:
                spec.delay = random.uniform(0, schedule.jitter_seconds)
            previous = insert_tasks(conn, [spec], self.schema)[0]
            fired.append((fire.nominal_at, previous))
            nominal_ats.append(fire.nominal_at), outcomes.append("fired")
            task_ids.append(previous), details.append(fire.detail)
        for nominal_at, outcome, detail in plan.records:
            nominal_ats.append(nominal_at), outcomes.append(outcome), task_ids.append(None), details.append(detail)
        if nominal_ats:
            conn.execute(self.sql["schedule_fire_record"], dict(
                schedule=schedule.name, nominal_ats=nominal_ats, outcomes=outcomes, task_ids=task_ids,
                details=details))
        conn.execute(self.sql["schedule_advance"], dict(
            name=schedule.name, next_fire_at=plan.next_fire_at, buffered_fire_at=plan.buffered_fire_at,
            last_fire_at=fired[-1][0] if fired else None, last_task_id=previous if fired else None,
            fires=len(fired), skips=plan.skips))
        return FiredSchedule(schedule.name, now, fired, plan.records, plan.next_fire_at)

    def seconds_to_next_fire(self) -> float | None:
        """Seconds until the soonest enabled schedule is due (negative: overdue; None: none)."""
        rows = self._fetch("schedule_next_due", {})
        return rows[0][0] if rows else None

    def apply_schedules(self, schedules: Sequence[Schedule], *, prune: bool = False,
                        now: dt.datetime | None = None, max_payload_bytes: int = 1024 * 1024
                        ) -> dict[str, list[str]]:
        """Upsert definitions in one transaction; `prune` deletes schedules not among them.
        New and re-timed schedules start at their first fire after `now` (the database's).
        Returns the names {'created': [...], 'updated': [...], 'unchanged': [...], 'deleted': [...]}."""
        names = [s.name for s in schedules]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidInput(f"schedule name {duplicates[0]!r} is defined more than once")
        check_schedule_payloads(schedules, max_payload_bytes)
        report: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": [], "deleted": []}
        with self.connection() as conn, conn.transaction():
            now = conn.execute(self.sql["schedule_now"], {"now": now}).fetchone()[0]
            for s in schedules:
                params = s.as_dict()
                params.update(payload=Jsonb(s.payload), next_fire_at=s.first_fire(now))
                row = conn.execute(self.sql["schedule_upsert"], params).fetchone()
                if row is None:
                    report["unchanged"].append(s.name)
                else:
                    report["created" if row[1] else "updated"].append(s.name)
            if prune:
                deleted = conn.execute(self.sql["schedule_delete_except"], {"names": names}).fetchall()
                report["deleted"] = sorted(r[0] for r in deleted)
        return report

    def list_schedules(self, name: str | None = None) -> list[ScheduleStatus]:
        return [ScheduleStatus(Schedule(*row[:14]), *row[14:])
                for row in self._fetch("schedule_list", {"name": name})]

    def get_schedule(self, name: str) -> ScheduleStatus:
        found = self.list_schedules(name)
        if not found:
            raise ScheduleNotFound(f"schedule {name!r} not found")
        return found[0]

    def delete_schedule(self, name: str) -> None:
        if not self._fetch("schedule_delete", {"name": name}):
            raise ScheduleNotFound(f"schedule {name!r} not found")

    def set_schedule_enabled(self, name: str, enabled: bool) -> None:
        """Pause (enabled=False) or resume a schedule. Resuming starts at the first fire after
        now: the fires a paused schedule did not make are not caught up."""
        with self.connection() as conn, conn.transaction():
            now = conn.execute(self.sql["schedule_now"], {"now": None}).fetchone()[0]
            # on this transaction's connection: a one-connection pool (the CLI) has no other
            row = conn.execute(self.sql["schedule_list"], {"name": name}).fetchone()
            if row is None:
                raise ScheduleNotFound(f"schedule {name!r} not found")
            rows = conn.execute(self.sql["schedule_set_enabled"], dict(
                name=name, enabled=enabled, next_fire_at=Schedule(*row[:14]).first_fire(now))).fetchall()
            if not rows:  # deleted between the two statements
                raise ScheduleNotFound(f"schedule {name!r} not found")

    def fire_schedule_now(self, name: str, *, detail: str, max_payload_bytes: int = 1024 * 1024
                          ) -> tuple[dt.datetime, uuid.UUID, bool]:
        """Fire a schedule at once, under its current tick (Schedule.current_tick) and that tick's
        idempotency key: (nominal time, task id, whether this call fired it). A second call in the
        same tick, or one after the scheduler fired that time, finds the same task."""
        with self.connection() as conn, conn.transaction():
            # the row lock keeps a scheduler tick (SKIP LOCKED) and a PATCH off this schedule meanwhile
            if not conn.execute(self.sql["schedule_lock"], {"name": name}).fetchall():
                raise ScheduleNotFound(f"schedule {name!r} not found")
            now = conn.execute(self.sql["schedule_now"], {"now": None}).fetchone()[0]
            row = conn.execute(self.sql["schedule_list"], {"name": name}).fetchone()
            schedule, next_fire_at, buffered_fire_at = Schedule(*row[:14]), row[14], row[15]
            nominal = schedule.current_tick(next_fire_at, now)
            spec = TaskSpec(schedule.kind, schedule.payload, queue=schedule.queue, priority=schedule.priority,
                            max_attempts=schedule.max_attempts, max_payload_bytes=max_payload_bytes,
                            idempotency_key=idempotency_key(name, nominal))
            task_id = insert_tasks(conn, [spec], self.schema)[0]
            fired = conn.execute(self.sql["schedule_fire_now_record"], dict(
                schedule=name, nominal_at=nominal, task_id=task_id, detail=detail)).fetchall()
            if fired:
                conn.execute(self.sql["schedule_advance"], dict(
                    name=name, next_fire_at=next_fire_at, buffered_fire_at=buffered_fire_at,
                    last_fire_at=nominal, last_task_id=task_id, fires=1, skips=0))
        return nominal, task_id, bool(fired)

    def schedule_fires(self, name: str, limit: int = 100) -> list[tuple]:
        return self._fetch("schedule_fires_list", {"schedule": name, "limit": limit})

    # -- maintenance
    def delete_finished(self, state: str, older_than_seconds: float, limit: int = 500) -> int:
        """One retention batch: finished tasks (and their events) older than the retention."""
        return len(self._fetch("task_delete_finished", dict(state=state, older_than=older_than_seconds,
                                                            limit=limit)))

    def delete_old_fires(self, older_than_seconds: float, limit: int = 500) -> int:
        return len(self._fetch("schedule_fire_delete_old", dict(older_than=older_than_seconds, limit=limit)))

    def queue_stats(self) -> tuple[list[tuple[str, str, int]], list[tuple[str, int, float | None, bool]]]:
        """([(queue, state, tasks)], [(queue, claimable now, oldest claimable age s, paused)])."""
        with self.connection() as conn:
            counts = conn.execute(self.sql["queue_task_counts"]).fetchall()
            paused_kinds = [name for scope, name, _ in conn.execute(self.sql["pause_list"]).fetchall()
                            if scope == "kind"]
            if paused_kinds:
                claimable = conn.execute(self.sql["queue_claimable_without_kinds"],
                                         {"paused_kinds": paused_kinds}).fetchall()
            else:
                claimable = conn.execute(self.sql["queue_claimable"]).fetchall()
        return counts, claimable

    def throughput(self, minutes: int) -> tuple[dt.datetime, list[tuple[str, dt.datetime, int, int]]]:
        """(the window's first minute, [(queue, minute, completed, failed)]) over the last `minutes`
        whole minutes, the current one included; minutes without an outcome have no row."""
        with self.connection() as conn:
            since = conn.execute(self.sql["task_event_throughput_since"], {"minutes": minutes}).fetchone()[0]
            rows = conn.execute(self.sql["task_event_throughput"], {"since": since}).fetchall()
        return since, rows

    # -- the worker registry (skiplock.workers)
    def register_worker(self, record: "WorkerRecord") -> bool:
        """Insert a worker's row, or renew its heartbeat and in_flight. True when it inserted."""
        return self._fetch("worker_register", dict(
            id=record.id, host=record.host, pid=record.pid, queues=list(record.queues),
            concurrency=record.concurrency, in_flight=record.in_flight, version=record.version,
            lease_seconds=record.lease_seconds))[0][0]

    def delete_worker(self, worker_id: str) -> bool:
        """A clean exit; False when the row was already gone."""
        return bool(self._fetch("worker_delete", {"id": worker_id}))

    def delete_stale_workers(self, leases: float) -> list[tuple[str, str, int]]:
        """Rows whose heartbeat is older than `leases` of their own leases: [(id, host, pid)]."""
        return [tuple(r) for r in self._fetch("worker_delete_stale", {"leases": leases})]

    def list_workers(self) -> list["WorkerRecord"]:
        return [WorkerRecord(*row) for row in self._fetch("worker_list", {})]

    def worker_queue_counts(self) -> list[tuple[str, int, int]]:
        """[(queue, workers claiming from it, the sum of their concurrency)]."""
        return [tuple(r) for r in self._fetch("worker_queue_counts", {})]

    # -- webhooks and the outbox
    def _sync_outbox_trigger(self, conn: psycopg.Connection) -> None:
        """Fan-out costs nothing while no endpoint is enabled: the trigger does not exist then.
        Called under webhook_endpoints_lock, after the change, in the same transaction."""
        wanted = conn.execute(self.sql["webhook_endpoints_any_enabled"]).fetchone()[0]
        if conn.execute(self.sql["outbox_trigger_enabled"]).fetchone()[0] == wanted:
            return  # most changes switch nothing: take no lock on task_events
        conn.execute(self.sql["outbox_trigger_lock_timeout"])
        try:
            conn.execute(self.sql["outbox_trigger_drop"])  # one disabled by hand, too
            if wanted:
                conn.execute(self.sql["outbox_trigger_create"])
        except psycopg.errors.LockNotAvailable as exc:
            raise DatabaseUnavailable("could not switch the webhook outbox trigger: task_events is locked by a "
                                      "long transaction; try again") from exc

    def add_webhook(self, url: str, event_types: Sequence[str], secret: str,
                    description: str | None = None) -> WebhookEndpoint:
        endpoint_id = uuid7()
        with self.connection() as conn, conn.transaction():
            conn.execute(self.sql["webhook_endpoints_lock"])
            conn.execute(self.sql["webhook_endpoint_insert"], dict(
                id=endpoint_id, url=url, secret=secret, event_types=list(event_types), description=description))
            self._sync_outbox_trigger(conn)
        return self.get_webhook(endpoint_id)

    def list_webhooks(self, endpoint_id: uuid.UUID | str | None = None) -> list[WebhookEndpoint]:
        key = None if endpoint_id is None else _parse_uuid(endpoint_id, WebhookNotFound, "webhook")
        return [WebhookEndpoint(*row) for row in self._fetch("webhook_endpoint_list", {"id": key})]

    def get_webhook(self, endpoint_id: uuid.UUID | str) -> WebhookEndpoint:
        found = self.list_webhooks(endpoint_id)
        if not found:
            raise WebhookNotFound(f"webhook endpoint {endpoint_id} not found")
        return found[0]

    def remove_webhook(self, endpoint_id: uuid.UUID | str) -> None:
        """Deletes the endpoint and its deliveries (pending ones are not sent)."""
        key = _parse_uuid(endpoint_id, WebhookNotFound, "webhook")
        with self.connection() as conn, conn.transaction():
            conn.execute(self.sql["webhook_endpoints_lock"])
            if not conn.execute(self.sql["webhook_endpoint_delete"], {"id": key}).fetchall():
                raise WebhookNotFound(f"webhook endpoint {endpoint_id} not found")
            self._sync_outbox_trigger(conn)

    def set_webhook_secret(self, endpoint_id: uuid.UUID | str, secret: str) -> None:
        key = _parse_uuid(endpoint_id, WebhookNotFound, "webhook")
        if not self._fetch("webhook_endpoint_set_secret", {"id": key, "secret": secret}):
            raise WebhookNotFound(f"webhook endpoint {endpoint_id} not found")

    def set_webhook_enabled(self, endpoint_id: uuid.UUID | str, enabled: bool, reason: str | None = None) -> None:
        key = _parse_uuid(endpoint_id, WebhookNotFound, "webhook")
        with self.connection() as conn, conn.transaction():
            conn.execute(self.sql["webhook_endpoints_lock"])
            if not conn.execute(self.sql["webhook_endpoint_set_enabled"], dict(
                    id=key, enabled=enabled, reason=None if enabled else reason)).fetchall():
                raise WebhookNotFound(f"webhook endpoint {endpoint_id} not found")
            self._sync_outbox_trigger(conn)

    def claim_deliveries(self, limit: int, owner: str, lease_seconds: float) -> list[Delivery]:
        rows = self._fetch("webhook_delivery_claim", dict(limit=limit, owner=owner, lease_seconds=lease_seconds))
        return [Delivery(*row) for row in rows]

    def settle_deliveries(self, outcomes: Sequence[dict]) -> dict[uuid.UUID, str]:
        """Fenced outcomes [{id, token, outcome, status, error, delay}]; returns {id: new state}
        for those applied (a missing id lost its lease)."""
        if not outcomes:
            return {}
        rows = [{k: (str(v) if k == "id" else v) for k, v in o.items() if v is not None} for o in outcomes]
        return dict(self._fetch("webhook_delivery_settle", {"outcomes": Jsonb(rows)}))

    def heartbeat_deliveries(self, leases: Sequence[tuple[uuid.UUID, int]], lease_seconds: float) -> set[uuid.UUID]:
        if not leases:
            return set()
        rows = self._fetch("webhook_delivery_heartbeat", dict(
            ids=[i for i, _ in leases], tokens=[t for _, t in leases], lease_seconds=lease_seconds))
        return {r[0] for r in rows}

    def list_deliveries(self, *, state: str | None = None, endpoint_id: uuid.UUID | str | None = None,
                        after: uuid.UUID | str | None = None, limit: int = 100) -> list[DeliveryRecord]:
        rows = self._fetch("webhook_delivery_list", dict(
            state=state, limit=limit,
            endpoint_id=None if endpoint_id is None else _parse_uuid(endpoint_id, WebhookNotFound, "webhook"),
            after=None if after is None else _parse_uuid(after, InvalidInput, "cursor")))
        return [DeliveryRecord(*row) for row in rows]

    def get_delivery(self, delivery_id: uuid.UUID | str) -> DeliveryRecord:
        rows = self._fetch("webhook_delivery_get", {"id": _parse_uuid(delivery_id, DeliveryNotFound, "delivery")})
        if not rows:
            raise DeliveryNotFound(f"delivery {delivery_id} not found")
        return DeliveryRecord(*rows[0])

    def redeliver(self, *, delivery_id: uuid.UUID | str | None = None,
                  endpoint_id: uuid.UUID | str | None = None) -> int:
        """Dead deliveries back to pending, with a fresh attempt budget: one, or all of an endpoint."""
        params = dict(id=None, endpoint_id=None)
        if delivery_id is not None:
            params["id"] = _parse_uuid(delivery_id, DeliveryNotFound, "delivery")
        elif endpoint_id is not None:
            params["endpoint_id"] = _parse_uuid(endpoint_id, WebhookNotFound, "webhook")
        else:
            raise InvalidInput("redeliver: give a delivery id or an endpoint id")
        return len(self._fetch("webhook_delivery_redeliver", params))

    def outbox_stats(self) -> tuple[int, float]:
        """(deliveries pending or in flight, age in seconds of the oldest of them)."""
        count, age = self._fetch("outbox_stats", {})[0]
        return count, age

    def delete_old_deliveries(self, state: str, older_than_seconds: float, limit: int = 500) -> int:
        return len(self._fetch("webhook_delivery_delete_old", dict(state=state, older_than=older_than_seconds,
                                                                   limit=limit)))


class ReclaimedTask(NamedTuple):
    """A claim the reaper took back, and the state it left the task in."""

    id: uuid.UUID
    queue: str
    state: str  # queued (reclaimed), failed (reclaims or deadline spent) or cancelled
    kind: str
    attempts: int
    error: str | None


class WebhookEndpoint(NamedTuple):
    id: uuid.UUID
    url: str
    event_types: list[str]
    description: str | None
    enabled: bool
    disabled_reason: str | None
    created_at: dt.datetime
    pending: int
    dead: int


class Delivery(NamedTuple):
    """A claimed delivery attempt: what the dispatcher needs to send it and fence its outcome."""

    id: uuid.UUID
    event_id: uuid.UUID
    endpoint_id: uuid.UUID
    url: str
    secret: str
    event_type: str
    payload: Any
    attempts: int  # attempts made before this one
    lease_token: int
    created_at: dt.datetime


class DeliveryRecord(NamedTuple):
    id: uuid.UUID
    event_id: uuid.UUID
    endpoint_id: uuid.UUID
    event_type: str
    payload: Any
    state: str
    attempts: int
    next_attempt_at: dt.datetime
    last_status: int | None
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    delivered_at: dt.datetime | None


class WorkerRecord(NamedTuple):
    """A row of the worker registry: a worker as it registered itself, and its last heartbeat."""

    id: str  # the lease_owner of its claims
    host: str  # SKIPLOCK_POD_NAME, else the host name
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    version: str
    lease_seconds: float
    started_at: dt.datetime | None = None  # the database's clock; None before it registered
    heartbeat_at: dt.datetime | None = None
    heartbeat_age_seconds: float | None = None


def _parse_uuid(value: uuid.UUID | str, error: type[Exception], what: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise error(f"{what} id {value!r} is not a UUID") from None


class _BoundStore(Store):
    """The store `Store.transaction()` yields: every call runs on the one connection it holds."""

    def __init__(self, parent: Store, conn: psycopg.Connection):
        # not super().__init__(): that would build a second pool; share the parent's state
        self.__dict__.update(parent.__dict__)
        self._conn = conn
        self._claim_pool = self._outcome_pool = None

    @contextmanager
    def connection(self, timeout: float | None = None, *, pool: ConnectionPool | None = None):
        with translated_errors():
            yield self._conn

    def open(self, wait: bool = False) -> "Store":
        raise TypeError("a transaction's store has no pool of its own")

    def close(self) -> None:
        raise TypeError("a transaction's store has no pool of its own")


class FiredSchedule(NamedTuple):
    """What a tick did to one schedule."""

    name: str
    now: dt.datetime
    fired: list[tuple[dt.datetime, uuid.UUID]]  # (nominal time, task id)
    records: list[tuple[dt.datetime, str, str | None]]  # skipped / buffered / missed decisions
    next_fire_at: dt.datetime


def _parse_id(task_id: uuid.UUID | str) -> uuid.UUID:
    return _parse_uuid(task_id, TaskNotFound, "task")


def _id_list(ids: Sequence[uuid.UUID | str] | None) -> list[uuid.UUID] | None:
    return None if ids is None else [_parse_id(i) for i in ids]
