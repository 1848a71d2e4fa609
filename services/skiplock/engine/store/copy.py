"""The COPY path of task inserts: plain tasks (no idempotency key, no delay) in bulk, written
in COPY text format piece by piece while Postgres stores the previous piece.

It encodes rows and runs one COPY statement; which tasks take this path is the caller's choice
(tasks.task_insert, enqueueing.enqueue_many).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from .. import queries
from ..model import TaskSpec, encode_payload, uuid7
from .connection import translated_errors


# Bulk enqueues of plain tasks (no idempotency key, no delay) this large go through COPY, which
# moves rows faster than INSERT ... SELECT FROM unnest(...) (tests/benchmarks/RESULTS.md).
COPY_THRESHOLD = 64
# Rows per piece of a COPY: Postgres stores one piece while the next is encoded. The first
# pieces are small, so that Postgres starts early; encoding a row costs less than storing it,
# so each piece is ready before Postgres has stored the one before, and doubling never leaves
# it waiting.
COPY_FIRST_PIECE = 32
COPY_PIECE = 256


def pieces(n: int) -> Iterator[tuple[int, int]]:
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
    return f"\t{s.kind}\t{s.queue}\t{s.priority}\t", f"\t{max_attempts}\t1\t{_copy_field(s.concurrency_key)}\n"


# COPY text format's escapes for a free text field (kinds and queues are names: nothing to escape)
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_field(text: str) -> str:
    return text.translate(_COPY_ESCAPES)


def _copy_text(payload_json: str) -> str:
    return payload_json.replace("\\", "\\\\")


def copy_line(task_id: str, s: TaskSpec) -> str:
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

    def encoded() -> Iterator[str]:
        for i, j in pieces(len(payloads)):
            piece = payloads[i:j]
            piece_ids = uuid7.many(len(piece))
            ids.extend(piece_ids)
            yield "".join([f"{task_id.hex}{middle}{_copy_text(encode_payload(p, limit))}{end}"
                           for task_id, p in zip(piece_ids, piece)])

    copy_in(conn, encoded(), queries.load(schema))
    return ids


def copy_in(conn: psycopg.Connection, texts: Iterable[str], sql: dict[str, str]) -> None:
    """COPY the tasks (text format, piece by piece) as one unit, in the caller's transaction if
    it has one; the tasks_inserted trigger writes their events and wakes the workers when the
    COPY ends. Kinds and queues are validated names (no tab, newline or backslash); payloads are
    JSON text, whose only special character for COPY is the backslash of its escapes."""
    with translated_errors(), _unit(conn), conn.cursor().copy(sql["task_copy_in"]) as copy:
        for piece in texts:  # an error here (a payload refused) aborts the COPY
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
