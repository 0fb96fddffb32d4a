"""A real ``python -m ibmon run`` process for fault tests: start, scrape, signal, kill -9, inspect.

Every scrape goes through the test's ``TotalsWatch`` (one watch for all runs of a test), so a
port total that goes down fails the test on the scrape where it happens, across restarts too.
The process runs in its own session (``kill -9`` hits the whole group, and "no process outlived
it" is checked on the group). Logs are JSON lines in a file per run; ``traceback_free`` and
``events`` read them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.faults.promise import Scrape, TotalsWatch

__all__ = ["REPO", "DaemonProcess", "group_gone", "wait_until"]

REPO = Path(__file__).resolve().parents[2]


def wait_until(what: str, pred: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``pred`` until true; fail naming ``what`` after ``timeout`` (a safety net, not a
    timing assertion: every wait here is for something the daemon must do eventually)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def group_gone(pgid: int) -> bool:
    """True when no process of the group is left (nothing the daemon started outlived it)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


class DaemonProcess:
    """One daemon lifetime; ``start`` again for the next one (a new log file each time)."""

    def __init__(
        self,
        workdir: Path,
        config: Path | None,
        watch: TotalsWatch,
        *,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.config = config
        self.watch = watch
        self.args = args
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0
        self.logs: list[Path] = []

    # -- lifecycle -----------------------------------------------------------------------------

    def spawn(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "IBMON_LOG__FORMAT": "json", **self.extra_env}
        if "IBMON_STATE__PATH" not in self.extra_env:
            env.pop("IBMON_STATE__PATH", None)  # the config file names this test's state file
        self.starts += 1
        log = self.workdir / f"daemon-{self.starts}.log"
        self.logs.append(log)
        argv = [sys.executable, "-m", "ibmon", "run"]
        if self.config is not None:
            argv += ["--config", str(self.config)]
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [*argv, *self.args], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True,
            )
        return self.proc

    def start(self) -> None:
        """Spawn and wait until it listens (its port is read from the ``listening`` line)."""
        self.spawn()
        wait_until("the daemon to listen", self._listening)

    def _listening(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, self.log_text()
        ports = [int(e["port"]) for e in self.events("listening", run=self.starts)]
        if ports:
            self.port = ports[-1]
        return bool(ports)

    def kill9(self) -> None:
        """``kill -9`` the whole process group, as the OOM killer or a power cut would."""
        assert self.proc is not None
        pgid = self.proc.pid
        os.killpg(pgid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        wait_until("the killed group to be gone", lambda: group_gone(pgid))
        self.proc = None

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, *, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code. Nothing of its group may outlive it."""
        if self.proc is None:
            return 0
        proc = self.proc
        pgid = proc.pid
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            proc.wait(timeout=30)
            raise AssertionError(f"SIGTERM did not stop the daemon:\n{self.log_text()}") from None
        finally:
            self.proc = None
        wait_until("the daemon's process group to be gone", lambda: group_gone(pgid))
        return rc

    def cleanup(self) -> None:
        """For ``finally``: make sure nothing is left running, whatever the test did."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None

    # -- observing -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def scrape(self) -> Scrape:
        return self.watch.scrape(self.url)

    def scrape_until(
        self, what: str, pred: Callable[[Scrape], bool], timeout: float = 30.0
    ) -> Scrape:
        """Scrape (every scrape checked by the watch) until ``pred`` holds."""
        last: list[Scrape] = []

        def ok() -> bool:
            last[:] = [self.scrape()]
            return pred(last[0])

        wait_until(what, ok, timeout)
        return last[0]

    def log_text(self, run: int | None = None) -> str:
        logs = self.logs if run is None else [self.logs[run - 1]]
        return "".join(p.read_text(errors="replace") for p in logs if p.exists())

    def events(self, event: str | None = None, run: int | None = None) -> list[dict[str, Any]]:
        """The JSON log lines (of one run, or all), optionally only those of one event."""
        out = []
        for line in self.log_text(run).splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and (event is None or doc.get("event") == event):
                out.append(doc)
        return out

    def traceback_free(self) -> None:
        text = self.log_text()
        assert "Traceback" not in text, text
