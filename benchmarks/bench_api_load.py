"""Polls and memory of a real ``ibmon run`` on a 17,424-port fabric while API clients hammer it.

    .venv/bin/python benchmarks/bench_api_load.py [--hosts 3000] [--clients 0,4,8]
        [--window 30] [--mode first|walk|all]

Starts ``python -m ibmon run`` as its own process with one ``mock`` source (``hosts`` 3000 gives
17,424 ports) polled every second, waits for it to settle, then for each
client count runs that many threads fetching ``/api/v1/ports`` in a loop for ``--window`` seconds
and reports the daemon's polls per second (``ibmon_source_poll_duration_seconds_count`` at both
ends, over the time between those two scrapes, which a starved daemon stretches), its peak RSS
(``/proc/<pid>/status``) and the answers served. ``first``: the default page, as
dashboards and ``ibmon top`` ask; ``walk``: every page of 1,000 through the cursor (the whole
fabric, as a script would); ``all``: ``?limit=100000`` (clipped to one page now; the whole fabric
in one answer before). The first row (0 clients) is the baseline of the same run.

Exits 1 when, with the most clients, the daemon polls at less than 60 % of the baseline's rate or
its peak RSS exceeds the baseline's by more than 100 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=3000)
    ap.add_argument("--clients", default="0,4,8")
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--mode", choices=("first", "walk", "all"), default="first")
    args = ap.parse_args()
    counts = [int(x) for x in args.clients.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-api-"))
    cfg = tmp / "ibmon.toml"
    cfg.write_text('[prometheus]\nlisten = "127.0.0.1:0"\n[[sources]]\ntype = "mock"\n'
                   f'hosts = {args.hosts}\ninterval = "1s"\n')
    env = {**os.environ, "IBMON_LOG__FORMAT": "json", "IBMON_STATE__PATH": str(tmp / "s.json")}
    log_path = tmp / "daemon.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ibmon", "run", "--config", str(cfg)],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True)
    try:
        port = 0
        deadline = time.monotonic() + 120
        while not port:
            if proc.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text()[-2000:], file=sys.stderr)
                return 2
            for line in log_path.read_text().splitlines():
                if '"listening"' in line:
                    port = int(json.loads(line)["port"])
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"

        def get(path: str) -> bytes:
            with urllib.request.urlopen(base + path, timeout=300) as resp:
                return bytes(resp.read())

        def polls() -> float:
            body = get("/metrics").decode()
            m = re.search(r'^ibmon_source_poll_duration_seconds_count\{source="mock"\} (\S+)',
                          body, re.M)
            return float(m.group(1)) if m else 0.0

        def timed_polls() -> tuple[float, float]:
            count = polls()
            return count, time.monotonic()

        def rss_mb() -> float:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
            return 0.0

        while polls() < 3:
            time.sleep(0.5)
        time.sleep(5)
        rows: list[tuple[int, float, float, int, int]] = []
        for n in counts:
            stop = threading.Event()
            answers = [0]
            biggest = [0]

            def client(stop: threading.Event, answers: list[int], biggest: list[int]) -> None:
                while not stop.is_set():
                    if args.mode == "walk":
                        cursor = ""
                        while not stop.is_set():
                            body = get(f"/api/v1/ports?limit=1000{cursor}")
                            answers[0] += 1
                            biggest[0] = max(biggest[0], len(body))
                            nxt = json.loads(body)["next"]
                            if not nxt:
                                break
                            cursor = f"&cursor={nxt}"
                    else:
                        body = get("/api/v1/ports" + ("?limit=100000" if args.mode == "all"
                                                      else ""))
                        answers[0] += 1
                        biggest[0] = max(biggest[0], len(body))

            threads = [threading.Thread(target=client, args=(stop, answers, biggest), daemon=True)
                       for _ in range(n)]
            for t in threads:
                t.start()
            (start, t0), peak = timed_polls(), rss_mb()
            end = time.monotonic() + args.window
            while time.monotonic() < end:
                peak = max(peak, rss_mb())
                time.sleep(0.2)
            count, t1 = timed_polls()
            rate = (count - start) / (t1 - t0)
            stop.set()
            for t in threads:
                t.join(timeout=300)
            rows.append((n, rate, peak, answers[0], biggest[0]))
            print(f"{args.mode:5} clients={n}: {rate:.2f} polls/s over {t1 - t0:.0f} s,"
                  f" peak RSS {peak:.0f} MB, {answers[0]} answers, largest {biggest[0]} B",
                  flush=True)
            time.sleep(5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    base_polls, base_rss = rows[0][1], rows[0][2]
    last = rows[-1]
    ratio = last[1] / base_polls if base_polls else 0.0
    print(f"poll rate with {last[0]} clients / idle: {ratio:.2f};"
          f" RSS +{last[2] - base_rss:.0f} MB")
    return 0 if ratio >= 0.6 and last[2] - base_rss <= 100 else 1


if __name__ == "__main__":
    sys.exit(main())
