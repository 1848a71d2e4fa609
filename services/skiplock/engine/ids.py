"""The app-generated task ids: UUIDv7 (RFC 9562), in creation order within a process; and TaskId,
the id an enqueue returns, which says whether that enqueue made the task."""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid


class TaskId(uuid.UUID):
    """A task's id as an enqueue returns it: a UUID, with `created` False when it is an existing
    task's (a taken idempotency key, a unique duplicate, a debounced enqueue merged into the task
    that waits)."""

    __slots__ = ()
    created = True



class ExistingTaskId(TaskId):
    """A TaskId whose task an earlier enqueue made."""

    __slots__ = ()
    created = False


def existing_id(task_id: uuid.UUID) -> ExistingTaskId:
    """`task_id` (as a row gave it) as the id of a task this enqueue did not make."""
    return ExistingTaskId(int=task_id.int)


class _UUID7:
    """UUIDv7 (RFC 9562): 48-bit Unix ms, then a 12-bit counter seeded at random each ms so ids
    made by one process sort in creation order, then 62 random bits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def __call__(self) -> uuid.UUID:
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms > self._last_ms:
                self._last_ms = ms
                self._counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
            else:
                self._counter += 1
                if self._counter > 0xFFF:  # more than ~2k ids in one ms: borrow the next ms
                    self._last_ms += 1
                    self._counter = 0
                ms = self._last_ms
            counter = self._counter
        rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
        return uuid.UUID(int=value)

    def many(self, n: int, cls: type[uuid.UUID] = uuid.UUID) -> list:
        """n ids in one go (bulk enqueue): one clock read and one call for the random bits; `cls`
        is uuid.UUID or a subclass (TaskId)."""
        entropy = struct.unpack(f">{n}Q", os.urandom(8 * n))
        ids = []
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms > self._last_ms:
                counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
            else:
                ms, counter = self._last_ms, self._counter + 1
            for i in range(n):
                if counter > 0xFFF:
                    ms, counter = ms + 1, 0
                ids.append(cls(int=(ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64
                                     | 0b10 << 62 | entropy[i] & ((1 << 62) - 1)))
                counter += 1
            self._last_ms, self._counter = ms, counter - 1
        return ids


uuid7 = _UUID7()
