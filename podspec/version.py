"""The installed gpufrac's version, for both console scripts' ``--version``."""

from __future__ import annotations


def installed_version() -> str:
    """The ``gpufrac`` distribution's version; says so when run from an uninstalled tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpufrac")
    except PackageNotFoundError:
        return "unknown (not installed)"
