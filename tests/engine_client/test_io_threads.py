"""engine_client/io_threads.py: libzmq's I/O threads get SCHED_BATCH, and a system that refuses it only costs a log
line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zmq

from pyfront.engine_client.io_threads import IO_THREAD_PREFIX, batch_io_threads

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")


def io_threads() -> dict[int, int]:
    """This process's libzmq I/O threads: id -> scheduling policy."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().startswith(IO_THREAD_PREFIX):
                out[int(task.name)] = os.sched_getscheduler(int(task.name))
        except OSError:
            continue
    return out


def test_a_context_s_io_thread_becomes_batch_work() -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)  # the context starts its I/O thread with its first socket
    try:
        before = set(io_threads())
        assert before
        assert "SCHED_BATCH" in batch_io_threads()
        assert all(policy == os.SCHED_BATCH for policy in io_threads().values())
        assert "SCHED_BATCH" in batch_io_threads()  # again: nothing to change, same answer
    finally:
        sock.close(0)
        ctx.term()


def test_a_refusal_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = zmq.Context()
    try:
        ctx.socket(zmq.PULL).close()
        original = dict(io_threads())

        def refuse(*args: object) -> None:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "sched_getscheduler", lambda tid: os.SCHED_OTHER)
        monkeypatch.setattr(os, "sched_setscheduler", refuse)
        assert batch_io_threads().startswith("left as they are: ")
        monkeypatch.undo()
        assert {tid: policy for tid, policy in io_threads().items() if tid in original} == original
    finally:
        ctx.term()


def test_the_engine_client_s_threads_are_batch_work_and_serve() -> None:
    from tests.harness import MODEL, running_harness

    with running_harness() as harness:
        engine = harness.app.state.serving.engine  # type: ignore[attr-defined]
        assert "SCHED_BATCH" in engine.io_threads
        assert engine._sockets.kind.startswith("zmtp"), engine._sockets.kind  # the requests below take ZMTP
        with harness.http() as http:
            for _ in range(20):
                answer = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
                assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
