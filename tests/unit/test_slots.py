"""Slots decides every race over the worker's capacity under one lock, with no database and no
thread of its own: these tests drive it as the claimer, the handler threads, the completer and the
keeper do, and check the busy count, the held runs and the claim limit after each step."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from prometheus_client import CollectorRegistry, Gauge

from skiplock.engine.model import ClaimedTask, TaskDef
from skiplock.worker.slots import Run, Slots
from skiplock.worker.task_context import TaskContext


class InflightGauge:
    """The worker's in-flight gauge, on a registry of its own, read as a scrape reads it."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.gauge = Gauge("inflight", "runs held", registry=self.registry)

    def set(self, value):
        self.gauge.set(value)

    def value(self) -> float:
        return self.registry.get_sample_value("inflight")


def make_slots(concurrency=4, claim_batch=4, poll_seconds=60.0):
    gauge = InflightGauge()
    stopping = threading.Event()
    return Slots(concurrency, claim_batch, poll_seconds, stopping, gauge), stopping, gauge


def make_runs(n, *, limited=False, timeout=None, is_async=False):
    async def handler_async(ctx, payload):
        return None

    def handler(ctx, payload):
        return None

    definition = TaskDef("t.kind", handler_async if is_async else handler, timeout=timeout)
    runs = []
    for _ in range(n):
        task = ClaimedTask(uuid.uuid4(), "t.kind", "default", {}, 1, 1, None, 0.0, limited)
        runs.append(Run(task, TaskContext(task, None), definition))
    return runs


def claim(slots, n, **kwargs):
    """What the claimer does: ask for a limit, claim `n` of it (at most the limit)."""
    limit, announced = slots.claim_limit()
    runs = make_runs(min(n, limit), **kwargs)
    slots.claimed(runs, limit, announced)
    return limit, runs


def test_a_claim_asks_for_the_free_slots_at_most_a_batch():
    slots, _, gauge = make_slots(concurrency=4, claim_batch=3)
    assert slots.claim_limit()[0] == 3
    limit, runs = claim(slots, 3)
    assert (limit, slots.busy, slots.in_flight(), gauge.value()) == (3, 3, 3, 3)
    assert slots.claim_limit()[0] == 1  # one slot left
    assert slots.counts["claimed"] == 3


def test_after_a_claim_that_found_the_queues_empty_the_next_waits_for_an_announcement():
    slots, _, _ = make_slots()
    limit, runs = claim(slots, 1)  # asked for 4, got 1: drained
    assert (limit, len(runs)) == (4, 1)
    assert slots.claim_limit()[0] == 0, "a drained claim goes again before the poll interval"
    slots.announce()
    assert slots.claim_limit()[0] == 3
    assert slots.wake.is_set()


def test_the_poll_interval_ends_the_wait_after_a_drained_claim():
    slots, _, _ = make_slots(poll_seconds=0.05)
    claim(slots, 0)
    assert slots.claim_limit()[0] == 0
    time.sleep(0.06)
    assert slots.claim_limit()[0] == 4


def test_work_announced_while_a_claim_runs_means_the_queues_were_not_drained():
    slots, _, _ = make_slots()
    limit, announced = slots.claim_limit()
    slots.announce()  # a notification arrives between the claim's snapshot and its result
    slots.claimed(make_runs(1), limit, announced)
    assert slots.claim_limit()[0] == 3


def test_a_returned_handler_frees_its_slot_but_the_run_stays_held_until_written():
    slots, _, gauge = make_slots()
    _, runs = claim(slots, 4)
    assert slots.claim_limit()[0] == 0
    assert all(slots.handler_returned(run) for run in runs[:2])
    assert (slots.busy, slots.in_flight(), slots.claim_limit()[0]) == (2, 4, 2)
    slots.written(runs[:2], settled=2, rejected=0)
    assert (slots.busy, slots.in_flight(), gauge.value()) == (2, 2, 2)
    assert slots.counts["settled"] == 2 and slots.holding()


def test_at_most_concurrency_outcomes_wait_for_the_writer_then_no_claim_is_made():
    slots, _, _ = make_slots(concurrency=2, claim_batch=2)
    for _ in range(2):  # two rounds: 4 runs whose handlers returned, none written
        _, runs = claim(slots, 2)
        for run in runs:
            slots.handler_returned(run)
    assert (slots.busy, slots.in_flight()) == (0, 4)
    assert slots.claim_limit()[0] == 0, "claims in flight grow past twice the concurrency"
    slots.wake.clear()
    slots.written(list(slots.held())[:2], settled=2, rejected=0)
    assert slots.wake.is_set(), "the held-back claimer is not woken when the writer catches up"
    assert slots.claim_limit()[0] == 2


def test_a_limited_run_s_written_outcome_makes_the_claimer_look_again():
    slots, _, _ = make_slots()
    _, runs = claim(slots, 1, limited=True)  # drained
    assert slots.claim_limit()[0] == 0
    slots.handler_returned(runs[0])
    slots.wake.clear()
    slots.written(runs, settled=1, rejected=0)
    assert slots.wake.is_set() and slots.claim_limit()[0] == 4


def test_a_run_lost_by_the_heartbeat_frees_its_slot_once_and_drops_its_outcome():
    slots, _, _ = make_slots()
    _, runs = claim(slots, 3)
    assert slots.lose([runs[0]]) == [runs[0]]
    assert slots.lose([runs[0]]) == []  # lost twice: freed once
    assert slots.handler_returned(runs[0]) is False  # its handler returns later: outcome dropped
    assert (slots.busy, slots.in_flight()) == (2, 2)
    assert runs[0] not in slots.held()


def test_a_run_written_between_the_heartbeat_s_snapshot_and_its_loss_is_not_lost():
    slots, _, _ = make_slots()
    _, runs = claim(slots, 2)
    snapshot = slots.held()
    slots.handler_returned(runs[0])
    slots.written([runs[0]], settled=1, rejected=0)
    assert slots.lose(snapshot) == [runs[1]]
    assert (slots.busy, slots.in_flight()) == (0, 0)


def test_a_sync_handler_past_its_timeout_is_asked_then_abandoned_after_the_grace():
    slots, _, _ = make_slots()
    _, sync_runs = claim(slots, 2, timeout=1.0)
    slots.announce()
    _, async_runs = claim(slots, 1, timeout=1.0, is_async=True)
    start = sync_runs[0].started
    assert slots.abandon_overdue(start + 1.5, stuck_grace=1.0) == []
    assert all(run.ctx.cancel_requested for run in sync_runs + async_runs)
    abandoned = slots.abandon_overdue(start + 2.5, stuck_grace=1.0)
    assert set(abandoned) == set(sync_runs), "only the sync handlers hold a thread to abandon"
    assert (slots.busy, slots.stuck) == (1, 2)
    assert slots.handler_returned(sync_runs[0]) is False  # the stuck thread comes back at last
    assert (slots.busy, slots.stuck) == (1, 1)


def test_shutdown_releases_only_the_runs_whose_handlers_have_not_returned():
    slots, stopping, _ = make_slots()
    _, runs = claim(slots, 3)
    slots.handler_returned(runs[0])
    stopping.set()
    assert slots.claim_limit()[0] == 0, "a stopping worker claims"
    assert set(slots.release_unfinished()) == set(runs[1:])
    assert slots.busy == 0
    assert slots.handler_returned(runs[1]) is False


def test_gather_returns_once_half_a_batch_is_free_or_the_window_ends():
    slots, _, _ = make_slots(concurrency=4, claim_batch=4)
    _, runs = claim(slots, 4)
    freer = threading.Timer(0.02, lambda: [slots.handler_returned(r) for r in runs[:2]])
    freer.start()
    started = time.monotonic()
    slots.gather(window=5.0)
    assert time.monotonic() - started < 4.0, "gather waited out its window with half a batch free"
    assert slots.busy == 2
    freer.join()
    slots.gather(window=0.05)  # nothing more is freed: the window ends it
    assert slots.busy == 2


def test_gather_does_not_wait_after_a_drained_claim():
    slots, _, _ = make_slots()
    claim(slots, 1)
    started = time.monotonic()
    slots.gather(window=5.0)
    assert time.monotonic() - started < 4.0


@pytest.mark.parametrize("round_", range(5))
def test_handlers_returning_while_the_keeper_loses_and_abandons_free_each_slot_exactly_once(round_):
    """Three threads race over 200 runs: handler threads return them, the keeper loses some and
    abandons the overdue: every slot is freed once, whoever gets there first."""
    slots, _, _ = make_slots(concurrency=200, claim_batch=200)
    _, runs = claim(slots, 200, timeout=0.0)
    start = threading.Barrier(3)
    kept = []

    def handlers():
        start.wait()
        kept.extend(run for run in runs if slots.handler_returned(run))

    def keeper_lose():
        start.wait()
        for i in range(0, 200, 3):
            slots.lose(runs[i:i + 2])

    def keeper_abandon():
        start.wait()
        slots.abandon_overdue(runs[-1].started + 10, stuck_grace=0.0)

    threads = [threading.Thread(target=f) for f in (handlers, keeper_lose, keeper_abandon)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    given_up = [run for run in runs if run.given_up]
    assert slots.busy == 0
    assert len(kept) + len(given_up) == 200, "a run was both kept and given up, or neither"
    assert not set(kept) & set(given_up)
    # every abandoned run's thread came back (the handler thread returned them all): none stuck
    assert slots.stuck == 0
