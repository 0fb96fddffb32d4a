"""The MAD worker process: it says why it cannot open a port, can always be killed, and the
``mad`` source backs off before opening a failing port again (no device needed).

The simulator-backed behaviour (a frozen fabric, a frozen worker, a fabric that returns) is in
``tests/faults/test_fabric_health.py``.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import stat
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

from ibmon.sources.libibmad import ATTR_NODE_INFO, CLASS_SMI, MadError, MadRequest
from ibmon.sources.mad import MadSource
from ibmon.sources.madworker import _CHILD, _PACKAGE_ROOT, MadWorker, MadWorkerGoneError

NO_CA = "ibmon_no_such_ca"


def fake_python(tmp_path: Path, body: str) -> str:
    """An "interpreter" for MadWorker that ignores its arguments and runs ``body`` (sh)."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def worker(python: str | None = None, ca: str = NO_CA) -> MadWorker:
    kw = {} if python is None else {"python": python}
    return MadWorker(ca=ca, port=0, timeout=0.1, retries=0, window=8, **kw)


def test_a_port_that_cannot_open_is_explained_in_one_line() -> None:
    w = worker()
    try:
        with pytest.raises(MadError) as info:
            w.wait_ready(30.0)
    finally:
        assert w.close()
    assert info.value.cause == "absent"
    assert "cannot open a MAD port" in str(info.value) and "\n" not in str(info.value)
    assert not w.alive


def test_a_worker_that_never_opens_is_not_waited_for_forever(tmp_path: Path) -> None:
    w = worker(fake_python(tmp_path, "exec sleep 60"))
    try:
        assert w.wait_ready(0.3) is False
        assert w.alive  # still trying, as a worker waiting for its simulator would be
    finally:
        assert w.close(grace=0.1)
    assert not w.alive


@pytest.mark.parametrize("pipe_kept_open", [False, True])
def test_kill_frees_a_reader_blocked_on_a_frozen_worker(tmp_path: Path,
                                                        pipe_kept_open: bool) -> None:
    """The thread waiting for an answer is released at once, not when the fabric answers; also
    when the worker's pipe stays open after SIGKILL (a worker stuck in the kernel; here a
    process it left behind holds the pipe): the reader gives up by itself."""
    ready = frames_file(tmp_path / "ready.frame", ("ready",))
    holder = tmp_path / "holder.pid"
    behind = f"sleep 30 & echo $! > {holder}; " if pipe_kept_open else ""
    w = worker(fake_python(tmp_path, f"cat {ready}; {behind}exec sleep 60"))  # then silence
    errors: list[BaseException] = []

    def batch() -> None:
        try:
            w.run([MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=())])
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    t = threading.Thread(target=batch)
    try:
        assert w.wait_ready(10.0)
        t.start()
        time.sleep(0.3)
        assert t.is_alive()  # blocked: the worker does not answer
        w.kill()
        t.join(timeout=5)
        assert not t.is_alive()
    finally:
        if pipe_kept_open:
            with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
                os.kill(int(holder.read_text()), signal.SIGKILL)
        t.join(timeout=30)
        assert w.close()
    assert len(errors) == 1 and isinstance(errors[0], MadWorkerGoneError)
    assert "killed by signal 9" in str(errors[0])


def test_a_garbled_answer_is_an_error_not_a_crash(tmp_path: Path) -> None:
    w = worker(fake_python(tmp_path, r'printf "\000\000\000\002\377\377"; exec sleep 60'))
    try:
        with pytest.raises(MadError, match="malformed frame"):
            w.wait_ready(10.0)
    finally:
        assert w.close(grace=0.1)


def test_a_worker_that_dies_says_how(tmp_path: Path) -> None:
    w = worker(fake_python(tmp_path, "exit 3"))
    try:
        with pytest.raises(MadWorkerGoneError, match="exited with status 3"):
            w.wait_ready(10.0)
    finally:
        assert w.close()


async def test_the_source_backs_off_before_opening_a_failing_port_again() -> None:
    src = MadSource(ca=NO_CA)
    try:
        with pytest.raises(MadError, match="cannot open a MAD port"):
            await src.discover()
        with pytest.raises(MadError, match="cannot open a MAD port"):  # first reopen: at once
            await src.discover()
        with pytest.raises(MadError, match=r"MAD port closed; reopening in \d"):
            await src.sample()
        pids = src.worker_pids
    finally:
        await src.close()
    assert pids == []  # every worker that failed was closed and reaped


def test_a_one_off_batch_does_not_replace_the_batch_repeated_on_again(tmp_path: Path) -> None:
    """A poll's counter requests cross the pipe once; the detail reads that follow some polls
    go as a one-off, so the next poll is still an ``again``."""
    ready = tmp_path / "ready.frame"
    body = marshal.dumps(("ready",))
    ready.write_bytes(struct.pack(">I", len(body)) + body)
    got = tmp_path / "frames"
    w = worker(fake_python(tmp_path, f"cat {ready}; exec cat > {got}"))
    poll = [MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=())]
    details = [MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=(1,))]
    try:
        assert w.wait_ready(10.0)
        w.send(poll)
        w.send(poll)
        w.send(details, keep=False)
        w.send(poll)
    finally:
        assert w.close()
    raw, frames = got.read_bytes(), []
    while raw:
        (n,) = struct.unpack(">I", raw[:4])
        frames.append(marshal.loads(raw[4 : 4 + n]))
        raw = raw[4 + n :]
    assert [f[0] for f in frames] == ["run", "again", "once", "again"]
    assert frames[2][1] == [tuple(r) for r in details]


def frames_file(path: Path, *frames: object) -> Path:
    """``frames`` as the worker writes them (length-prefixed ``marshal``), in one file."""
    raw = b""
    for f in frames:
        body = marshal.dumps(f)
        raw += struct.pack(">I", len(body)) + body
    path.write_bytes(raw)
    return path


def streaming_worker(tmp_path: Path) -> MadWorker:
    """A worker that answers one batch of five MADs in three frames: two parts and the rest."""
    answers = frames_file(
        tmp_path / "answers",
        ("ready",),
        ("part", [(b"a", None), (None, "timeout")]),
        ("part", [(b"c", None), (None, "status_0x000c")]),
        ("ok", [(b"e", None)]),
    )
    return worker(fake_python(tmp_path, f"cat {answers}; exec cat > /dev/null"))


def test_a_batch_answered_in_parts_comes_back_whole_and_in_request_order(tmp_path: Path) -> None:
    """The worker streams a big batch's answers as they complete, so the daemon decodes the first
    ones while later MADs are in flight; whoever reads the batch sees one ordered list."""
    w = streaming_worker(tmp_path)
    try:
        assert w.wait_ready(10.0)
        out = w.run([MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=(p,)) for p in range(5)])
    finally:
        assert w.close()
    assert [(r.data, r.error) for r in out] == [
        (b"a", None), (None, "timeout"), (b"c", None), (None, "status_0x000c"), (b"e", None)
    ]


async def test_a_batch_not_read_to_its_end_retires_the_worker(tmp_path: Path) -> None:
    """A caller that stops reading a streamed batch (its decoding raised) leaves answers in the
    pipe, where the next batch would read them as its own: the workers are replaced first."""
    src = MadSource()
    w = streaming_worker(tmp_path)
    try:
        assert w.wait_ready(10.0)
        src._worker = w
        results = src._results([MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=(p,)) for p in range(5)])
        assert next(results).data == b"a"
        assert src._broken is None
        results.close()  # what a raise in the caller's loop does to the generator
        assert src._broken == "a batch was not read to its end"
    finally:
        await src.close()


def test_a_frame_that_has_begun_is_read_to_its_end_past_the_deadline(tmp_path: Path) -> None:
    """The deadline applies to a frame's start only: a frame cut in two by the pipe is waited
    for, not abandoned half read (which would leave its tail to be read as the next frame)."""
    ready = frames_file(tmp_path / "ready.frame", ("ready",)).read_bytes()
    head, tail = ready[:2], ready[2:]
    octal = "".join(f"\\{b:03o}" for b in head), "".join(f"\\{b:03o}" for b in tail)
    w = worker(fake_python(tmp_path, f"printf '{octal[0]}'; sleep 0.6; printf '{octal[1]}'; "
                                     "exec sleep 60"))
    try:
        assert w.wait_ready(0.3)
    finally:
        assert w.close(grace=0.1)



def test_a_failure_inside_the_worker_comes_back_as_one_line(tmp_path: Path) -> None:
    """Whatever goes wrong in the child is an error frame and one-line MadError, never a
    traceback (here: arguments without a CA)."""
    args = marshal.dumps({"parent": os.getpid(), "port": 0}).hex()
    w = worker(fake_python(tmp_path, f'exec "{sys.executable}" -S -c "{_CHILD}" '
                                     f"{_PACKAGE_ROOT} {args}"))
    try:
        with pytest.raises(MadError) as info:
            w.wait_ready(30.0)
    finally:
        assert w.close()
    assert str(info.value) == "MAD worker failed: KeyError: 'ca'"
    assert info.value.cause == "unknown"
