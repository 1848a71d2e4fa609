"""The COPY path of task inserts: plain tasks (no idempotency key, no delay) in bulk, written
in COPY text format piece by piece while Postgres stores the previous piece.

It encodes rows; task_inserts runs the COPY statement, and which tasks take this path is its
caller's choice (task_inserts._insert_plan, enqueueing.enqueue_many).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from ..ids import TaskId, uuid7
from ..model import TaskSpec, encode_payload


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
    trace = _COPY_NULL if s.trace_context is None else _copy_field(json.dumps(s.trace_context, separators=(",", ":")))
    return (f"\t{s.kind}\t{s.queue}\t{s.priority}\t",
            f"\t{max_attempts}\t1\t{_copy_field(s.concurrency_key)}\t{trace}\n")


# COPY text format's escapes for a free text field (kinds and queues are names: nothing to escape)
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_field(text: str) -> str:
    return text.translate(_COPY_ESCAPES)


def _copy_text(payload_json: str) -> str:
    return payload_json.replace("\\", "\\\\")


def copy_line(task_id: str, s: TaskSpec) -> str:
    middle, end = _copy_frame(s)
    return f"{task_id}{middle}{_copy_text(s.payload_json)}{end}"


def copy_pieces(template: TaskSpec, payloads: Sequence[Any], ids: list[uuid.UUID]) -> Iterator[str]:
    """The COPY text of plain tasks that differ only in their payloads, the other fields taken
    from `template`, piece by piece; each piece's ids are made (appended to `ids`) and its
    payloads encoded and checked (InvalidInput, PayloadTooLarge) only when it is asked for, so
    Postgres stores one piece while the next is encoded."""
    middle, end = _copy_frame(template)
    limit = template.max_payload_bytes
    for i, j in pieces(len(payloads)):
        piece = payloads[i:j]
        piece_ids = uuid7.many(len(piece), TaskId)
        ids.extend(piece_ids)
        yield "".join([f"{task_id.hex}{middle}{_copy_text(encode_payload(p, limit))}{end}"
                       for task_id, p in zip(piece_ids, piece)])
