"""Settings of the example shop: one app (orders), Postgres through psycopg 3, nothing else.

DATABASE_URL names the database, as a URL or a libpq conninfo string.
"""

import os

from psycopg.conninfo import conninfo_to_dict

# example only: a real project reads its secret from the environment or a file
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-shop-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = ["orders"]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "shop.urls"
USE_TZ = True

_db = conninfo_to_dict(os.environ["DATABASE_URL"])
DATABASES = {
    "default": {
        # with psycopg (3) installed, this backend's connection.connection is a psycopg.Connection,
        # which skiplock.enqueue writes into
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
