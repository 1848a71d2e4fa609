"""skiplock.contrib.django is imported only when used: the library, its CLI and its worker import no
Django, and on a Django without django.tasks (Django 5.2, the 3.11 venv's) the backend fails with
one line. The backend itself is tested under tests/django (Python 3.12, Django 6)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def test_the_library_the_cli_and_the_worker_import_no_django():
    code = ("import sys, skiplock, skiplock.cli, skiplock.worker, skiplock.worker.worker; "
            "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(importlib.util.find_spec("django") is None or importlib.util.find_spec("django.tasks") is not None,
                    reason="needs a Django without django.tasks (Django < 6)")
def test_on_a_django_before_6_the_backend_says_so_in_one_line():
    import django
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured) as raised:
        importlib.import_module("skiplock.contrib.django")
    assert str(raised.value) == (f"skiplock.contrib.django needs Django 6 or newer (django.tasks); this is "
                                 f"Django {django.get_version()}")
