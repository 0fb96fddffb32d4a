"""A compute node's daemon without TLS starts without OpenSSL.

OpenSSL's two libraries are about 4.5 MB of resident memory once mapped, a tenth of a node
daemon, and a stock interpreter maps them in every asyncio program whether it uses TLS or not:
asyncio imports ``ssl`` when it is imported, and pydantic's import of ``secrets`` pulls in
``hashlib``'s OpenSSL backend (``_hashlib``). A node serving ``/metrics`` over plain HTTP (the
common case: loopback, or a scrape network) needs neither. So on ``ibmon run``'s fast path
(``ibmon.cli.entry``), when neither the config file nor any ``IBMON_*`` variable mentions TLS,
``ssl`` and ``_hashlib`` are unimportable (``sys.modules[name] = None``, the import system's
documented way to make an import fail) while the daemon's modules load, and importable again
afterwards. What that changes:

- ``hashlib`` uses CPython's built-in SHA-1/SHA-256 (ibmon hashes short strings only: shard
  assignment, event ids, the basic-auth check), which give the same digests.
- asyncio's modules keep ``ssl = None`` until something needs TLS: ``enable_tls()``, called
  wherever ibmon builds a server TLS context (a reload that turns on TLS for ``/metrics``),
  imports ``ssl`` then and gives it to them. Their layout (``ssl`` bound at import, and
  ``sslproto.SSLAgainErrors`` derived from it) was checked for CPython 3.11-3.13, so only
  those versions defer. Whatever imports ``ssl`` itself later (MQTT: aiomqtt and paho) simply
  loads OpenSSL then.

The scan errs towards loading OpenSSL: the file unreadable, or "tls" in any case anywhere in it
(a comment too) or in an ``IBMON_`` variable's name or value, and nothing is blocked. Only the
fast path defers; every other command (``demo``, ``check-config``, ``run`` with unusual options
through the typer app) imports as usual.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["enable_tls", "import_without_openssl"]

#: The modules whose import maps OpenSSL; blocked only while asyncio and hashlib bind to them.
_OPENSSL = ("ssl", "_hashlib")
_state = {"deferred": False}


def _mentions_tls(config: Path | None, environ: Mapping[str, str]) -> bool:
    for name, value in environ.items():
        if name.upper().startswith("IBMON_") and ("TLS" in name.upper() or "tls" in value.lower()):
            return True
    if config is None:
        return False
    try:
        return b"tls" in config.read_bytes().lower()
    except OSError:
        return True  # the loader will report it; decide nothing on a guess


def import_without_openssl(config: Path | None, environ: Mapping[str, str] | None = None) -> bool:
    """Import asyncio, hashlib and hmac with OpenSSL blocked, unless the config may use TLS.

    Those are the modules that bind OpenSSL when they are imported (``ssl`` for asyncio,
    ``_hashlib`` for hashlib and hmac); once they have bound None, ``ssl`` and ``_hashlib`` are
    importable again for whoever asks for them directly. False (nothing done) when the config
    may use TLS, or when any of them is already imported (blocking would change nothing but
    mislead ``enable_tls``).
    """
    if not (3, 11) <= sys.version_info[:2] <= (3, 13):
        return False
    env = os.environ if environ is None else environ
    bound = ("asyncio", "hashlib", "hmac", *_OPENSSL)
    if any(m in sys.modules for m in bound) or _mentions_tls(config, env):
        return False
    for m in _OPENSSL:
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        import asyncio  # noqa: F401
        import hashlib  # noqa: F401
        import hmac  # noqa: F401
    finally:
        for m in _OPENSSL:
            del sys.modules[m]
    _state["deferred"] = True
    return True


def enable_tls() -> None:
    """Import ``ssl``, and give it to asyncio if this process started without it.

    asyncio looks ``ssl`` up in its modules' globals when it wraps a connection, so binding it
    there (and the one constant ``sslproto`` derives from it) is all a TLS server needs.
    """
    import ssl

    if _state["deferred"]:
        from asyncio import base_events, selector_events, sslproto

        for module in (base_events, selector_events, sslproto):
            module.ssl = ssl  # type: ignore[attr-defined]
        sslproto.SSLAgainErrors = (ssl.SSLWantReadError, ssl.SSLSyscallError)
        _state["deferred"] = False
