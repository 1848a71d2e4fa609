"""The example shop's settings without skiplock in TASKS (nor the shop's app, whose tasks take
skiplock's options): a worker refuses them (test_worker.py)."""

from shop.settings import *  # noqa: F401,F403

INSTALLED_APPS = []
TASKS = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
