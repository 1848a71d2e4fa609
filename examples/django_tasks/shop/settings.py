"""Settings of the example shop on Django's task framework: one app (orders), Postgres through
psycopg 3, and skiplock as the TASKS backend in the same database.

DATABASE_URL names the database, as a URL or a libpq conninfo string; skiplock's tables are in it
too (`skiplock migrate`), so an enqueue joins the view's transaction.
"""

import os

from psycopg.conninfo import conninfo_to_dict

# example only: a real project reads its secret from the environment or a file
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-shop-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

# skiplock.contrib.django gives `manage.py skiplock_worker`; it has no models
INSTALLED_APPS = ["orders", "skiplock.contrib.django"]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "shop.urls"
USE_TZ = True

_db = conninfo_to_dict(os.environ["DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.pop("dbname"),
        "USER": _db.pop("user", ""),
        "PASSWORD": _db.pop("password", ""),
        "HOST": _db.pop("host", ""),
        "PORT": _db.pop("port", ""),
        "OPTIONS": _db,  # any other libpq parameter (sslmode, ...)
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {
    "default": {
        "BACKEND": "skiplock.contrib.django.SkiplockBackend",
        "QUEUES": ["default", "emails"],
        # DATABASE: the Django database that holds skiplock's tables ("default" if not given);
        # a raising task is tried up to MAX_ATTEMPTS times (Django's own default: once)
        "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": 1, "RETRY_BASE": 2.0, "RETRY_CAP": 300.0},
    }
}
