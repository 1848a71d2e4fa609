"""The gunicorn target, `skiplock.api.wsgi:app`, configured from SKIPLOCK_* variables. Holds
nothing but the app (`skiplock api` is the supported way to run it)."""

from .app import create_app

app = create_app()
