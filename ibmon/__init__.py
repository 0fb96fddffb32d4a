"""ibmon: InfiniBand fabric monitoring daemon.

The version is written once, in ``pyproject.toml``; ``__version__`` reads it from the installed
distribution's metadata when first asked (``importlib.metadata`` is not imported by
``import ibmon`` itself). A source tree that was never installed reports ``0+unknown``.
"""

from __future__ import annotations

__all__ = ["__version__"]

_UNINSTALLED = "0+unknown"


def __getattr__(name: str) -> str:
    """``ibmon.__version__``: the installed distribution's version, looked up once."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("ibmon")
    except PackageNotFoundError:
        found = _UNINSTALLED
    globals()["__version__"] = found
    return found
