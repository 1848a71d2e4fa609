"""How a skiplock worker runs a Django task: the handler registered for its kind.

The handler reads the task's payload ({"args": [...], "kwargs": {...}}), calls the function (an
`async def` one on the worker's event loop), and returns its JSON-normalised value as the task's
result. A raised exception is a failed attempt: skiplock retries it after the kind's backoff
until max_attempts, then fails it (raise skiplock.Fail to fail at once, skiplock.Retry(delay) to
choose the delay).

Django's database connections are handled as around a request: close_old_connections() before
and after each run, so a connection past CONN_MAX_AGE, or broken by the run, is closed and the
next run opens a fresh one; with CONN_MAX_AGE = 0 (Django's default) each run closes its own.
Handler threads are long-lived, so a connection that may be kept is reused by the next run on
that thread, as a web server's worker thread reuses it.

Django's task_started and task_finished signals are sent with the task's TaskResult (read from
the database, so a takes_context task's TaskContext has its attempts and worker ids); a failed
attempt that will be retried is not finished, and sends no task_finished.
"""

from __future__ import annotations

import logging
from inspect import iscoroutinefunction

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.tasks.base import TaskContext, TaskResultStatus
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

import skiplock

log = logging.getLogger("skiplock.contrib.django")


def register_kind(task, options) -> None:
    """Register the handler of `task`'s kind with skiplock (skiplock.task), in this process."""
    handler = _async_handler(task, options) if iscoroutinefunction(task.func) else _sync_handler(task, options)
    # named after the Django function: skiplock refuses a kind defined twice in two places
    handler.__module__, handler.__qualname__ = task.func.__module__, task.func.__qualname__
    skiplock.task(task.module_path, queue=task.queue_name, max_attempts=options.max_attempts,
                  timeout=options.timeout, retry_base=options.retry_base, retry_cap=options.retry_cap)(handler)


def _sync_handler(task, options):
    def run(ctx, payload):
        close_old_connections()
        try:
            result = _started(task, ctx)
            try:
                arguments = (TaskContext(task_result=result),) if task.takes_context else ()
                value = normalize_json(task.func(*arguments, *payload["args"], **payload["kwargs"]))
            except BaseException as exc:
                _failed(task, ctx, options, result, exc)
                raise
            _succeeded(task, result, value)
            return value
        finally:
            close_old_connections()
    return run


def _async_handler(task, options):
    async def run(ctx, payload):
        # the ORM's async calls run on one thread (thread-sensitive): its connections are closed there
        await sync_to_async(close_old_connections)()
        try:
            result = await sync_to_async(_started)(task, ctx)
            try:
                arguments = (TaskContext(task_result=result),) if task.takes_context else ()
                value = normalize_json(await task.func(*arguments, *payload["args"], **payload["kwargs"]))
            except BaseException as exc:
                await sync_to_async(_failed)(task, ctx, options, result, exc)
                raise
            await sync_to_async(_succeeded)(task, result, value)
            return value
        finally:
            await sync_to_async(close_old_connections)()
    return run


def _started(task, ctx):
    """The run's TaskResult, RUNNING, read from the database; task_started sent."""
    backend = task.get_backend()
    result = backend.get_result(str(ctx.task_id))
    object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    task_started.send(type(backend), task_result=result)
    return result


def _succeeded(task, result, value) -> None:
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(type(task.get_backend()), task_result=result)


def _failed(task, ctx, options, result, exc: BaseException) -> None:
    """task_finished for the last attempt (or a Fail); an attempt that will be retried is not
    finished."""
    if isinstance(exc, skiplock.Retry) or (ctx.attempt < options.max_attempts and not isinstance(exc, skiplock.Fail)):
        return
    object.__setattr__(result, "status", TaskResultStatus.FAILED)
    object.__setattr__(result, "finished_at", timezone.now())
    try:
        task_finished.send(type(task.get_backend()), task_result=result)
    except Exception as signal_exc:  # noqa: BLE001 - a receiver's error must not hide the task's
        log.warning("task_finished receiver raised", extra={"error": str(signal_exc)})
