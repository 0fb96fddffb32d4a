"""The API client of ``ibmon top --url``, ``explain``, ``jobs`` and ``topology`` against real
HTTP servers on loopback: a redirect never carries the operator's credentials anywhere, and
what a server says in an error reaches the terminal as one line of visible text, and a
password typed into ``--url`` is refused without being printed, whatever it holds."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ibmon.cli.apiclient import ApiClient, ApiError, check_url, redact_url


@contextmanager
def _server(respond: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), respond)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class _Answer(BaseHTTPRequestHandler):
    """Answers every GET with ``answer()``: status, reason, headers, body."""

    def answer(self) -> tuple[int, str | None, dict[str, str], bytes]:
        raise NotImplementedError

    def do_GET(self) -> None:
        status, reason, headers, body = self.answer()
        self.send_response(status, reason)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_redirect_is_refused_and_the_password_goes_nowhere_else() -> None:
    seen: list[str | None] = []

    class Elsewhere(_Answer):
        def answer(self) -> tuple[int, str | None, dict[str, str], bytes]:
            seen.append(self.headers.get("Authorization"))
            return 200, None, {"Content-Type": "application/json"}, json.dumps(
                {"ports": [], "count": 0}).encode()

    with _server(Elsewhere) as other:
        target = f"http://127.0.0.1:{other.server_address[1]}/api/v1/ports"

        class Redirecting(_Answer):
            def answer(self) -> tuple[int, str | None, dict[str, str], bytes]:
                return 302, None, {"Location": target}, b""

        with _server(Redirecting) as daemon:
            client = ApiClient(f"http://127.0.0.1:{daemon.server_address[1]}",
                               user="ops", password="s3cret")
            with pytest.raises(ApiError, match=r"HTTP 302, redirected to .*does not redirect"):
                client.get("/api/v1/ports")
        assert seen == []  # nothing reached the other server, the credentials least of all
        # the same client reads a server that answers itself, with its credentials
        assert ApiClient(f"http://127.0.0.1:{other.server_address[1]}", user="ops",
                         password="s3cret").get("/api/v1/ports") == {"ports": [], "count": 0}
        assert seen == ["Basic b3BzOnMzY3JldA=="]


def test_a_proxy_from_the_environment_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A site-wide ``http_proxy`` (common on cluster management nodes) is for the internet: the
    daemon is asked directly, and the proxy never sees a request or the credentials. Through
    it, every command failed with "connection refused" at the daemon's own address."""
    seen: list[str | None] = []

    class Proxy(_Answer):
        def answer(self) -> tuple[int, str | None, dict[str, str], bytes]:
            seen.append(self.headers.get("Authorization"))
            return 502, "Bad Gateway", {}, b""

    class Daemon(_Answer):
        def answer(self) -> tuple[int, str | None, dict[str, str], bytes]:
            return 200, None, {"Content-Type": "application/json"}, b'{"ports": []}'

    with _server(Proxy) as proxy, _server(Daemon) as daemon:
        for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.server_address[1]}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        client = ApiClient(f"http://127.0.0.1:{daemon.server_address[1]}", user="ops",
                           password="s3cret")
        assert client.get("/api/v1/ports") == {"ports": []}
    assert seen == []


def test_a_servers_error_text_is_one_line_with_its_control_characters_shown() -> None:
    """A server (a proxy, something else on the port) may answer with escape sequences in its
    status line or error: ``ibmon explain`` shows them, it does not play them on the
    operator's terminal. (A process of its own: the CLI sets up logging on the stderr it has.)"""

    class Hostile(_Answer):
        def answer(self) -> tuple[int, str | None, dict[str, str], bytes]:
            return 500, "Oops\x1b[2J", {}, json.dumps(
                {"error": "\x1b]0;title\x07\x1b[31mred\nsecond line"}).encode()

    with _server(Hostile) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        proc = subprocess.run([sys.executable, "-m", "ibmon", "explain", "0x1/1", "--url", url],
                              capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"ibmon: error: {url}: HTTP 500 Oops\\x1b[2J: \\x1b]0;title\\x07"
                           "\\x1b[31mred\\x0asecond line\n")


@pytest.mark.parametrize("password", ["s3cr3t", "pa/ss", "pa?ss", "pa#ss", "p@ss", "p:ss", "a]b"])
def test_a_password_in_the_url_is_refused_and_never_shown(password: str) -> None:
    """A password may hold what ends a URL's authority (``/``, ``?``, ``#``, ``@``): it is
    still the part hidden, and the URL is refused for being in it, not for a port or a host
    the parser made of the password."""
    url = f"http://ops:{password}@127.0.0.1:9683/api"
    shown = redact_url(url)
    assert shown == "http://ops:***@127.0.0.1:9683/api"
    with pytest.raises(ApiError, match="--password-file") as refused:
        check_url(url)
    assert password not in str(refused.value) and shown in str(refused.value)
    assert redact_url("http://127.0.0.1:9683/api") == "http://127.0.0.1:9683/api"
    check_url("http://127.0.0.1:9683/proxy/ibmon%40dc1")  # the way to put an @ in a path
