"""Soak, CI-sized (issue 19, "Bounded at scale"): a steady enqueue into one worker and one
scheduler on a Postgres of the test's own with autovacuum on, fsync and synchronous commit on.
Every task enqueued is completed, the backlog stays bounded, retention deletes what it should, and
the tables and indexes stop growing.

`make soak` runs the full form (tests/benchmarks/soak.py: 30 minutes at 60 % of the measured drain
rate, completed tasks kept 30 s, retention every 5 s, Postgres's defaults). This one is the same
`Soak` for three minutes with its clocks compressed: the sizes of a queue's tables settle only
after a few autovacuum rounds and retention periods, which at the defaults (autovacuum_naptime
1 min, 30 s kept) takes longer than a test may run. Here autovacuum_naptime is 10 s, completed
tasks are kept 10 s and retention runs every 2 s: three minutes cover about eighteen rounds of
each. The rate is modest (a few hundred tasks/s) so as not to starve the tests beside it. Nothing
here is a timing: the assertions are counts, and sizes against sizes of the same run.
"""

from __future__ import annotations

import pytest

from skiplock.engine import migrate
from tests.benchmarks import soak as soak_mod
from tests.benchmarks.run import BENCH_SERVER_SETTINGS
from tests.pgcluster import ThrowawayCluster
from tests.support.harness import scalar, state_counts, wait_for

RATE = 300          # tasks/s
SECONDS = 180      # the three minutes
INTERVAL = 10       # seconds per sample
TICK = 2            # the recorder reads completed events this often, well within the 10 s kept
KEEP, RETENTION_EVERY, NAPTIME = 10, 2, 10


@pytest.fixture
def cluster():
    with ThrowawayCluster(settings={**BENCH_SERVER_SETTINGS, "autovacuum_naptime": NAPTIME}) as pg:
        yield pg


def test_a_steady_rate_completes_everything_and_the_database_stays_bounded(cluster, processes):
    migrate.apply(cluster.url)
    soak = soak_mod.Soak(cluster.url, processes.spawn, processes.wait_ready, concurrency=10,
                         retain_completed=KEEP, retention_every=RETENTION_EVERY, log=print)
    try:
        owners = soak_mod.index_owners(soak.db)
        print(f"\n{RATE} tasks/s for {SECONDS} s; completed tasks kept {KEEP} s, retention every "
              f"{RETENTION_EVERY} s, autovacuum_naptime {NAPTIME} s")
        print(soak_mod.header())
        samples = soak.run(RATE, SECONDS, INTERVAL, tick=TICK,
                           on_sample=lambda s: print(soak_mod.row(s, owners)))
        totals = soak.drain()
        reference = samples[len(samples) // 3]
        print(soak_mod.breakdown(reference, samples[-1]))
        print(f"totals: {totals}; size {samples[-1].size / 2**20:.1f} MB at the end against "
              f"{reference.size / 2**20:.1f} MB at {reference.minute * 60:.0f} s; backlog at most "
              f"{max(s.backlog for s in samples)}")

        # every task enqueued was completed once: deleted by retention or still kept, none failed
        assert totals["enqueued"] >= RATE * SECONDS * 0.9
        # (retention goes on deleting: the kept count is drain()'s, read with the deleted one)
        assert set(state_counts(soak.db)) <= {"completed"}
        assert totals["deleted"] + totals["kept"] == totals["enqueued"]
        # the backlog never held more than a few seconds of enqueueing: unbounded growth (retention
        # or the claim falling behind) shows as a backlog that only grows. Ten seconds, not five:
        # in a whole suite on 2 cores, a stall of the machine left 1,549 and 2,052 (5.2-6.8 s)
        assert max(s.backlog for s in samples) <= RATE * 10
        # retention deleted every task finished more than its retention (and a run) ago, with its
        # events: none is left without its task
        wait_for(lambda: scalar(soak.db, "SELECT count(*) FROM skiplock.tasks WHERE finished_at < now() - "
                                "%s * interval '1 second'", (KEEP + 2 * RETENTION_EVERY,)) == 0,
                 30, interval=0.5, message="retention of the tasks past their time")
        assert scalar(soak.db, "SELECT count(*) FROM skiplock.task_events") == 3 * scalar(
            soak.db, "SELECT count(*) FROM skiplock.tasks")
        # sizes flat: the end at most 1.2 times the size after the first third
        assert samples[-1].size <= 1.2 * reference.size, soak_mod.breakdown(reference, samples[-1])
    finally:
        soak.close()
