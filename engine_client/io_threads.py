"""libzmq's I/O threads scheduled as batch work (Linux ``SCHED_BATCH``): messages are queued for them, not chased.

libzmq moves every message through a background I/O thread: a send puts the message on a pipe and wakes the I/O
thread if it sleeps; a received message is the I/O thread waking the reader. Under Linux's default policy a woken
thread that has slept preempts the running one at once (its virtual run time is behind), so with the front end on
one core every engine request and every output batch cost two context switches and an I/O-thread run that moves
one message. Measured on the 2-core VM, the front end pinned to one core, 6,000 short requests over 64 connections:
11,000 context switches, the I/O thread 280 ms of CPU (~47 us a request, on the event loop's core), 3,200-3,400
requests/s. As batch work the I/O thread wakes without preempting: it runs when the event loop waits for events or
its time slice ends, and then moves every message queued since: 400 context switches, 15 ms, 4,100-4,400
requests/s; streams (CPU per token, TTFT) and sequential latency unchanged. On an idle core it runs at once, as
before. Nothing else changes: the same messages in the same order, in the same libzmq.

Done from Python on the threads libzmq names ``ZMQbg/IO/N`` (rather than with libzmq's ``ZMQ_THREAD_SCHED_POLICY``,
which aborts the process if the system refuses the policy): a system that refuses it, or has no such threads or
policy, keeps the default and logs why once.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

IO_THREAD_PREFIX = "ZMQbg/IO/"
"""How libzmq names its I/O threads (``ZMQ_THREAD_NAME_PREFIX`` unset, as pyfront leaves it)."""


def batch_io_threads() -> str:
    """Give this process's libzmq I/O threads ``SCHED_BATCH``; returns what was done (also logged)."""
    policy = getattr(os, "SCHED_BATCH", None)
    tasks = Path("/proc/self/task")
    if policy is None or not tasks.is_dir():
        return _say("left as they are: no SCHED_BATCH or /proc on this system")
    done = 0
    for task in tasks.iterdir():
        try:
            if not (task / "comm").read_text().startswith(IO_THREAD_PREFIX):
                continue
            tid = int(task.name)
            if os.sched_getscheduler(tid) != policy:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            done += 1
        except (OSError, ValueError) as exc:  # the thread ended, or the system refuses the policy
            return _say(f"left as they are: {exc}", logging.WARNING)
    if not done:
        return _say("left as they are: none found")
    return _say(f"{done} scheduled as batch work (SCHED_BATCH)", logging.DEBUG)


def _say(what: str, level: int = logging.INFO) -> str:
    logger.log(level, "ZMQ I/O threads: %s", what)
    return what
