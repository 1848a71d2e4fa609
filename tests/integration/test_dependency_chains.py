"""Deep dependency chains (issue 37): a transition of a chain's root moves every task below it in
one walk of the chain, not in trigger recursion as deep as the chain, so cancelling, failing,
completing or resuming the root of a chain of 10,000 finishes, and a worker's other outcomes in
the same batch are written with it. Real Postgres."""

from __future__ import annotations

import psycopg
import pytest

import skiplock
from skiplock.engine.model import Settlement
from skiplock.engine.task_actions import cancel_task, resume_task
from tests.support.harness import scalar

DEPTH = 10_000


# A chain's tasks below the root as enqueue leaves them (task_parents_watch,
# task_insert_dependent, task_dependencies_insert): waiting on one parent, watched when they have
# a dependent. One statement, since enqueueing 10,000 one by one is what the 1,000 test below does.
CHAIN_BELOW = """
WITH links AS (
    SELECT i, gen_random_uuid() AS id FROM generate_series(1, %(n)s) AS i
), chain AS (
    SELECT i, id, coalesce(lag(id) OVER (ORDER BY i), %(root)s) AS parent FROM links
), inserted AS (
    INSERT INTO skiplock.tasks (id, kind, queue, priority, payload, max_attempts, event_seq, state, waiting_on,
                                watched)
    SELECT id, 'chain.link', 'default', 0, jsonb_build_object('i', i), 3, 1, 'waiting', 1, i < %(n)s FROM chain
    RETURNING id
)
INSERT INTO skiplock.task_dependencies (task_id, parent_id)
SELECT c.id, c.parent FROM chain AS c JOIN inserted USING (id)
RETURNING task_id, parent_id
"""


def enqueued_chain(db_url, depth: int) -> list:
    """A root and depth - 1 tasks, each depending on the one before, enqueued as a submitter
    would: one enqueue each."""
    with psycopg.connect(db_url) as conn:
        ids = [skiplock.enqueue(conn, "chain.link", {"i": 0})]
        for i in range(1, depth):
            ids.append(skiplock.enqueue(conn, "chain.link", {"i": i}, depends_on=[ids[-1]]))
    return ids


@pytest.fixture
def chain(db_url) -> list:
    """A root (enqueued) and DEPTH - 1 tasks below it, in chain order."""
    root = skiplock.enqueue(db_url, "chain.link", {"i": 0})
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE skiplock.tasks SET watched = true WHERE id = %s", (root,))
        edges = dict(conn.execute(CHAIN_BELOW, dict(n=DEPTH - 1, root=root)).fetchall())
    below = {parent: task for task, parent in edges.items()}
    ids = [root]
    while ids[-1] in below:
        ids.append(below[ids[-1]])
    assert len(ids) == DEPTH
    return ids


def states(db, ids) -> dict[str, int]:
    rows = db.execute("SELECT state, count(*) FROM skiplock.tasks WHERE id = ANY(%s) GROUP BY state",
                      (ids,)).fetchall()
    return dict(rows)


def claim_root_and_another(store, db_url, chain):
    """The root and an unrelated task, claimed together by one worker."""
    other = skiplock.enqueue(db_url, "chain.other", {})
    claimed = {t.id: t for t in store.tasks.task_claim(["default"], 10, "w", 300)}
    assert set(claimed) == {chain[0], other}
    return claimed[chain[0]], claimed[other]


def test_cancelling_the_root_of_a_deep_chain_cancels_all_of_it(store, db, chain):
    assert states(db, chain) == {"queued": 1, "waiting": DEPTH - 1}
    assert cancel_task(store, chain[0], actor="test") == "cancelled"
    assert states(db, chain) == {"cancelled": DEPTH}
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND cancelled_by_parent",
                  (chain,)) == DEPTH - 1
    # each task's history ends with its cancel, gap-free
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE task_id = ANY(%s) AND type = 'cancelled'",
                  (chain,)) == DEPTH
    # the last one names its own parent, not the root
    assert scalar(db, "SELECT last_error FROM skiplock.tasks WHERE id = %s", (chain[-1],)) \
        == f"parent {chain[-2]} ended cancelled"


def test_failing_the_root_of_a_deep_chain_writes_the_whole_batch(store, db_url, db, chain):
    root, other = claim_root_and_another(store, db_url, chain)
    applied = store.tasks.task_settle([Settlement(root.id, root.lease_token, "failed", error="boom"),
                                       Settlement(other.id, other.lease_token, "completed")])
    assert set(applied) == {root.id, other.id}
    assert states(db, chain) == {"failed": 1, "cancelled": DEPTH - 1}
    assert scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (other.id,)) == "completed"
    # resuming the failed root re-arms the whole chain behind it
    assert resume_task(store, root.id, actor="test") == "queued"
    assert states(db, chain) == {"queued": 1, "waiting": DEPTH - 1}
    assert scalar(db, "SELECT sum(waiting_on) FROM skiplock.tasks WHERE id = ANY(%s)", (chain,)) == DEPTH - 1
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND failed_parents > 0",
                  (chain,)) == 0


def test_completing_the_root_of_a_deep_chain_queues_the_next(store, db_url, db, chain):
    root, other = claim_root_and_another(store, db_url, chain)
    applied = store.tasks.task_settle([Settlement(root.id, root.lease_token, "completed"),
                                       Settlement(other.id, other.lease_token, "completed")])
    assert set(applied) == {root.id, other.id}
    assert states(db, chain) == {"completed": 1, "queued": 1, "waiting": DEPTH - 2}
    assert scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (chain[1],)) == "queued"
    # the next one fails: everything below it is cancelled in its outcome's transaction
    (second,) = store.tasks.task_claim(["default"], 10, "w", 300)
    assert second.id == chain[1]
    assert set(store.tasks.task_settle([Settlement(second.id, second.lease_token, "failed", error="x")])) == {second.id}
    assert states(db, chain) == {"completed": 1, "failed": 1, "cancelled": DEPTH - 2}


def test_cancelling_the_root_of_an_enqueued_chain_cancels_all_of_it(store, db_url, db):
    ids = enqueued_chain(db_url, 1_000)
    assert states(db, ids) == {"queued": 1, "waiting": 999}
    assert cancel_task(store, ids[0], actor="test") == "cancelled"
    assert states(db, ids) == {"cancelled": 1_000}


def test_a_root_cancelled_from_another_table_s_trigger_still_reaches_its_chain(db_url, db):
    """The walk runs whatever the trigger depth: an application's own trigger that cancels a
    task (here, on a table of its own) moves every task below it too."""
    ids = enqueued_chain(db_url, 50)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.orders_cancelled (task_id uuid)")
        conn.execute("""
            CREATE FUNCTION public.cancel_order_task() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                UPDATE skiplock.tasks SET state = 'cancelled', finished_at = now() WHERE id = NEW.task_id;
                RETURN NULL;
            END $$""")
        conn.execute("CREATE TRIGGER orders_cancelled AFTER INSERT ON public.orders_cancelled"
                     " FOR EACH ROW EXECUTE FUNCTION public.cancel_order_task()")
        conn.execute("INSERT INTO public.orders_cancelled VALUES (%s)", (ids[0],))
    assert states(db, ids) == {"cancelled": 50}
    # and the walk's marker did not outlive it: a later cancel in a new transaction walks too
    more = enqueued_chain(db_url, 20)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO public.orders_cancelled VALUES (%s)", (more[0],))
    assert states(db, more) == {"cancelled": 20}
