"""How a task row reads as Django's TaskResult: every skiplock state has a status, and an error
event's exception class path (pure mapping, no database)."""

from __future__ import annotations

from django.tasks import TaskResultStatus

from skiplock.contrib.django import results
from skiplock.engine.model import STATES


def test_every_state_has_a_status():
    assert set(results.STATUSES) == set(STATES)
    assert {s for s, status in results.STATUSES.items() if status == TaskResultStatus.READY} == {"waiting", "queued"}
    assert {s for s, status in results.STATUSES.items() if status == TaskResultStatus.FAILED} == {"failed", "cancelled"}


def test_the_class_path_comes_from_the_traceback_or_the_error():
    trace = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    raise Declined('no')\n"
             "orders.tasks.Declined: no\n")
    assert results.task_error({"error": "Declined: no", "traceback": trace}).exception_class_path == "orders.tasks.Declined"
    assert results.task_error({"error": "ValueError: bad", "traceback": "Traceback ...\nValueError: bad\n"}
                              ).exception_class_path == "builtins.ValueError"
    timed_out = results.task_error({"error": "TimeoutError: timed out after 5s"})
    assert (timed_out.exception_class_path, timed_out.traceback) == ("builtins.TimeoutError",
                                                                    "TimeoutError: timed out after 5s")
