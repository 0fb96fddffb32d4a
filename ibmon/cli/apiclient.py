"""A small client for a running daemon's JSON API: ``ibmon top --url``, ``explain``, ``topology``.

The daemon's listener may require basic auth and serve TLS with a private CA, so the client
takes a user, a password (from a file or ``IBMON_PASSWORD``, never a command-line argument that
``ps`` would show) and a CA file. Every failure becomes an ``ApiError`` with one line that says
what to do, never a traceback. ``IBMON_PASSWORD`` is not a setting: the settings loader skips it
(``ibmon.config.env.NOT_SETTINGS``), so exporting it never stops ``run``.

A URL is checked before anything is sent (``check_url``): one that ``urllib`` would trip over
later (an unclosed ``[``, a space, a port that is no number) is one line now, and one carrying
a password (``http://user:pw@host``) is refused without printing that password: a password on
the command line is visible in ``ps`` and shell history, which ``--password-file`` avoids.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ibmon.config.env import PASSWORD_ENV

__all__ = ["PASSWORD_ENV", "ApiClient", "ApiError", "read_password", "redact_url"]
#: Pages followed at most when collecting every page (a runaway cursor is a bug, not a fabric).
MAX_PAGES = 10_000


class ApiError(OSError):
    """A request to the daemon failed; ``str()`` is one line for the user."""


def read_password(path: Path | None) -> str | None:
    """The first line of ``path``, else ``$IBMON_PASSWORD``, else None."""
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ApiError(f"cannot read password file {path}: {exc.strerror or exc}") from None
        return text.splitlines()[0] if text else ""
    return os.environ.get(PASSWORD_ENV)


def redact_url(url: str) -> str:
    """``url`` with the password of any ``user:password@`` part replaced by ``***``.

    Pure string work, so even a URL that does not parse is safe to print. The password is
    everything from the first ``:`` to the last ``@``: a password typed as it is may hold
    ``/``, ``?``, ``#`` or ``@``, which end the authority for a URL parser (a URL whose path
    holds an ``@`` is shown redacted too: more hidden, never less)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, tail = rest.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon else user
    return f"{scheme}{sep}{shown}@{tail}"


def check_url(url: str) -> None:
    """ApiError with one line (never the password) unless ``url`` is a usable http(s) URL."""
    shown = redact_url(url)
    if not url.startswith(("http://", "https://")):
        raise ApiError(f"--url must start with http:// or https://, got {shown!r}")
    if shown != url:  # before parsing: a password's "/" or "?" would make it a port or a path
        raise ApiError(f"--url {shown!r}: {_NOT_IN_URL}")
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise ApiError(f"--url {shown!r}: a URL has no spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ApiError(f"--url {shown!r}: {_url_problem(exc)}") from None
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ApiError(f"--url {shown!r}: {_NOT_IN_URL}")
    if not parts.hostname:
        raise ApiError(f"--url {shown!r}: no host (e.g. http://127.0.0.1:9683)")
    if port is not None and port == 0:
        raise ApiError(f"--url {shown!r}: port 0 is no daemon's port")


_NOT_IN_URL = (f"give the user with --user and the password with --password-file or"
               f" ${PASSWORD_ENV}, not in the URL (an @ in a path is written %40)")


def _url_problem(exc: ValueError) -> str:
    text = str(exc)
    if "IPv6" in text:
        return "unbalanced brackets (an IPv6 address is written [::1], e.g. http://[::1]:9683)"
    if "Port" in text or "port" in text:
        return "the port must be a number from 1 to 65535"
    return "not a valid URL"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: the daemon's API never redirects, and urllib would send the
    basic-auth header along to wherever one points (another host, plain http as well)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class ApiClient:
    """GETs JSON from ``url`` (``http://`` or ``https://``), with basic auth and a CA file."""

    def __init__(self, url: str, *, user: str | None = None, password: str | None = None,
                 ca_file: Path | None = None, timeout: float = 10.0) -> None:
        check_url(url)
        if ca_file is not None and not url.startswith("https://"):
            raise ApiError("--ca-file needs an https:// URL")
        if password is not None and user is None:
            raise ApiError("a password needs --user")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._auth: str | None = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self._auth = f"Basic {token}"
        self._context: ssl.SSLContext | None = None
        if url.startswith("https://"):
            try:
                self._context = ssl.create_default_context(
                    cafile=str(ca_file) if ca_file is not None else None)
            except (OSError, ssl.SSLError) as exc:
                raise ApiError(f"cannot use CA file {ca_file}: {exc}") from None
        # No proxy from http_proxy/https_proxy: those are for the internet, and the daemon is
        # on the cluster's own network (often loopback), which a site-wide proxy cannot reach;
        # through one, every request failed as "connection refused" at the daemon's address
        # and the basic-auth header went to the proxy. Prometheus scrapes without them too.
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), _NoRedirects(),
            urllib.request.HTTPSHandler(context=self._context))

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        """The JSON answer to ``GET path?query``; ApiError with a useful line otherwise."""
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        # the scheme was checked in __init__: http(s) only
        req = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310
        if self._auth is not None:
            req.add_header("Authorization", self._auth)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(self._http_error(exc)) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise ApiError(f"{self.url}: TLS certificate not trusted "
                               f"({reason.verify_message}); give the CA with --ca-file") from None
            raise ApiError(f"cannot reach {self.url}: {reason}") from None
        except (TimeoutError, OSError) as exc:
            raise ApiError(f"cannot reach {self.url}: {exc}") from None
        try:
            return json.loads(body)
        except ValueError:
            raise ApiError(f"{url}: the answer is not JSON (is this an ibmon daemon?)") from None

    def _http_error(self, exc: urllib.error.HTTPError) -> str:
        if exc.code == 401:
            hint = ("wrong user or password" if self._auth else
                    "the daemon wants basic auth: give --user and --password-file")
            return f"{self.url}: HTTP 401 unauthorized ({hint})"
        if 300 <= exc.code < 400:
            return (f"{self.url}: HTTP {exc.code}, redirected to {exc.headers.get('Location')!r};"
                    " the daemon's API does not redirect: give --url the daemon's own address")
        try:
            detail = json.loads(exc.read()).get("error", "")
        except (ValueError, AttributeError, OSError):
            detail = ""
        return f"{self.url}: HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")

    def pages(self, path: str, *, limit: int = 1000) -> Iterator[dict[str, Any]]:
        """Every page of a paginated answer, following ``next`` until it is null."""
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            query = {"limit": str(limit)}
            if cursor is not None:
                query["cursor"] = cursor
            page = self.get(path, query)
            if not isinstance(page, dict):
                raise ApiError(f"{self.url}{path}: unexpected answer")
            yield page
            cursor = page.get("next")
            if not cursor:
                return
        raise ApiError(f"{self.url}{path}: more than {MAX_PAGES} pages")
