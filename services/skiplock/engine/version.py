"""The installed package's version, as `skiplock --version` and `GET /v1/` report it."""

from __future__ import annotations

# the source tree's own version (pyproject.toml's), for a run without an install; skiplock.__version__
SOURCE_VERSION = "0.1.0"


def package_version() -> str:
    """The version pip installed (pyproject.toml's); the source tree's own when run uninstalled."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("skiplock")
    except PackageNotFoundError:  # e.g. PYTHONPATH=services, no install
        return SOURCE_VERSION
