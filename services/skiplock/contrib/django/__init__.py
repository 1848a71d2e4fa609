"""skiplock as a backend of Django's task framework (`django.tasks`, Django 6; DEP 14).

    TASKS = {"default": {"BACKEND": "skiplock.contrib.django.SkiplockBackend"}}

A Django task is a skiplock task whose kind is the function's module path
(`orders.tasks.send_receipt`) and whose payload is `{"args": [...], "kwargs": {...}}`. Enqueue
writes the task in the transaction of Django's own connection (OPTIONS "DATABASE", default
"default"), or commits it at once on a database of its own (OPTIONS "DATABASE_URL").
`skiplock worker --django SETTINGS` (or `manage.py skiplock_worker`, with this package in
INSTALLED_APPS) runs the tasks. docs/GUIDE.md, "Django", has the whole contract.

Modules: backend.py (the backend and its Task class), results.py (a task row as a TaskResult),
running.py (how a worker calls a Django task), worker.py (Django set up in a worker process).
Importing this package imports Django 6's django.tasks; on an older Django it fails with one line.
"""

from .backend import SkiplockBackend, SkiplockTask

__all__ = ["SkiplockBackend", "SkiplockTask"]
