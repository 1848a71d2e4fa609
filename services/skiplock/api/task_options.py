"""The `unique` and `debounce` objects of a submitted task (POST /v1/tasks, /v1/tasks:batch), as the
API validates and documents them; engine/enqueue_options.py builds the engine's Unique and Debounce
from what they parse. No Flask here: the CLI's --unique-* and --debounce-* options mean the same.
"""

from __future__ import annotations

from ..engine.enqueue_options import MAX_KEY_NAMES, MAX_SECONDS
from ..engine.model import STATES
from .schema import Array, Boolean, Number, Object, String

UNIQUE = Object({
    "by_payload": Boolean("Unique by the whole payload too (its JSON, keys in any order).", default=False),
    "payload_keys": Array(String(min_length=1, max_length=255), "Unique by these payload keys' values too (a "
                          "missing key counts as absent). Not with by_payload.", min_items=1,
                          max_items=MAX_KEY_NAMES, nullable=True),
    "period": Number("The key holds within one fixed window of this many seconds of the database's clock "
                     "(counted from the Unix epoch); omitted: while a blocking task exists.", minimum=0.001,
                     maximum=MAX_SECONDS, nullable=True),
    "states": Array(String(enum=STATES), "The states in which a task blocks its duplicates: waiting, queued, "
                    "running and cancelling always; add completed, failed or cancelled. Default: the four.",
                    nullable=True),
}, "At most one task of this kind and queue (and payload) at a time: a duplicate answers 200 with the "
   "task that holds the key, and enqueues nothing.", nullable=True)
DEBOUNCE = Object({
    "key": String("Tasks of this kind, queue and key merge while one is queued and has not started.",
                  min_length=1, max_length=255),
    "delay": Number("The task starts this many seconds after the last enqueue of its burst.", minimum=0,
                    maximum=MAX_SECONDS),
    "max_wait": Number("... but never later than this many seconds after the burst's first enqueue.",
                       minimum=0.001, maximum=MAX_SECONDS, nullable=True),
}, "Merge a burst into one run: while a task of this key waits, this enqueue replaces its payload, priority "
   "and max_attempts and moves its start (200, that task). Not with run_at, delay, depends_on, unique or "
   "an idempotency key.", required=("key", "delay"), nullable=True)
