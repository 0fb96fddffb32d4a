"""A small client for a running daemon's JSON API: ``ibmon top --url``, ``explain``, ``topology``.

The daemon's listener may require basic auth and serve TLS with a private CA, so the client
takes a user, a password (from a file or ``IBMON_PASSWORD``, never a command-line argument that
``ps`` would show) and a CA file. Every failure becomes an ``ApiError`` with one line that says
what to do, never a traceback.
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

__all__ = ["PASSWORD_ENV", "ApiClient", "ApiError", "read_password"]

#: Environment variable with the basic auth password, when no password file is given.
PASSWORD_ENV = "IBMON_PASSWORD"  # noqa: S105 - the variable's name, not a password
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


class ApiClient:
    """GETs JSON from ``url`` (``http://`` or ``https://``), with basic auth and a CA file."""

    def __init__(self, url: str, *, user: str | None = None, password: str | None = None,
                 ca_file: Path | None = None, timeout: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ApiError(f"--url must start with http:// or https://, got {url!r}")
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
            with urllib.request.urlopen(req, timeout=self.timeout,  # noqa: S310 - http(s) only
                                        context=self._context) as resp:
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
