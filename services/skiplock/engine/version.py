"""The installed package's version, as `skiplock --version` and `GET /v1/` report it."""

from __future__ import annotations


def package_version() -> str:
    """The version pip installed (pyproject.toml's); the source tree's own when run uninstalled."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("skiplock")
    except PackageNotFoundError:  # e.g. PYTHONPATH=services, no install
        from .. import __version__

        return __version__
