"""The app that gives a Django project `manage.py skiplock_worker` (INSTALLED_APPS entry
"skiplock.contrib.django"). It has no models: skiplock's tables are skiplock's migrations', and its
console is the admin of its tasks (docs/GUIDE.md, "Django")."""

from django.apps import AppConfig


class SkiplockConfig(AppConfig):
    name = "skiplock.contrib.django"
    label = "skiplock"
    verbose_name = "skiplock"
