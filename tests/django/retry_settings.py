"""The example shop's settings with retries from the backend's OPTIONS (tests/django/test_worker.py):
two attempts, a short backoff. The worker runs with `--django tests.django.retry_settings`."""

from shop.settings import *  # noqa: F401,F403 - the example's settings, then the change

TASKS = {"default": {**TASKS["default"], "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": 2,  # noqa: F405
                                                     "RETRY_BASE": 0.1, "RETRY_CAP": 0.2}}}
