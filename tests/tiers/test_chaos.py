"""The opt-in chaos tier: engines and API servers fail under streaming load, and nothing hangs or leaks.

Run with ``python -m pytest -q -rP --chaos -m chaos tests/tiers/test_chaos.py`` (or ``tools/chaos/run_tier.sh``).

The deployment: ``pyfront serve --api-server-count 2 --data-parallel-size 2`` (the parent runs the engine
handshake for both API servers) and two external mock engines, one process per rank. Each mock runs as
``benchmarks/soak.py mock-rank`` (the mock engine plus a loopback HTTP endpoint that returns its ranks'
``mock_stats`` counters), so the test can read how many requests each engine still runs.

Under streaming load (``--clients`` raw HTTP/1.1 clients, benchmarks/httpconn.py, keep-alive), in order:
1. kill -9 the engine of rank 1;
2. stall the engine of rank 0 (SIGSTOP, then SIGCONT): with rank 1 dead, nothing can serve meanwhile;
3. kill -9 one API server (the supervisor keeps the other serving on the same port);
4. start rank 1 again (a new process, the same rank): it must be re-admitted and take requests.

Must hold: every request ends within `REQUEST_BOUND_S` (no hang) with data and ``[DONE]``, or a clean error
(an error status, or an SSE error event then ``[DONE]``); only requests in flight on the killed API server may
see their connection cut (and connections opened within `CUT_WINDOW_S` of its death, which the kernel may
still have queued on its listening socket); `/health` names rank 1 in ``degraded_ranks`` while it is dead;
every request started after the re-admission succeeds; after the load the engines' running counts and the
front end's in-flight count return to 0 (requests of the killed API server run to their max_tokens in the
engines: no front end is left to abort them); the restarted engine serves; the parent exits 0 on SIGTERM and
leaves no process behind. Printed: the faults, the requests in flight at each and
how they ended, the time to fail them, the time to re-admit the engine, leaked engine requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from benchmarks.httpconn import Conn, HTTPError
from tests.conftest import REPO_ROOT, free_port

pytestmark = pytest.mark.chaos

MODEL = "chaos"
CLIENTS = 10
STEP_INTERVAL_S = 0.02  # mock engine seconds per step: a 50..200-token stream takes 1..4 s
STALL_TIMEOUT_S = 2.0  # --engine-stall-timeout: pings go after 2 s of silence (the default interval)
REQUEST_BOUND_S = 30.0  # no request may take longer than this to end, whatever happened
STALL_S = 6.0
PHASE_S = 4.0
DRAIN_BOUND_S = 20.0
CUT_WINDOW_S = 1.0
SOAK = REPO_ROOT / "benchmarks" / "soak.py"


@dataclass
class Request:
    started: float
    ended: float = 0.0
    outcome: str = ""
    """ok | error_status | error_event | cut | hung | bad (a malformed or incomplete answer)"""
    detail: str = ""


@dataclass
class Fault:
    name: str
    at: float
    in_flight: list[Request]
    extra: dict[str, Any] = field(default_factory=dict)


class Load:
    """`CLIENTS` clients, each streaming one completion after another on its own keep-alive connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.requests: list[Request] = []
        self.active: set[int] = set()
        self.stop = False
        self.rng = random.Random(13)

    def in_flight(self) -> list[Request]:
        return [self.requests[i] for i in sorted(self.active)]

    async def client(self) -> None:
        conn = Conn("127.0.0.1", self.port)
        while not self.stop:
            body = json.dumps({
                "model": MODEL, "prompt": f"chaos {self.rng.randrange(10**6)} " * 8,
                "max_tokens": self.rng.randrange(50, 200), "stream": True,
            }).encode()  # fmt: skip
            index = len(self.requests)
            request = Request(time.monotonic())
            self.requests.append(request)
            self.active.add(index)
            try:
                request.outcome, request.detail = await asyncio.wait_for(self.one(conn, body), REQUEST_BOUND_S)
            except TimeoutError:
                request.outcome, request.detail = "hung", f"no end within {REQUEST_BOUND_S:g} s"
                conn.close(reset=True)
            request.ended = time.monotonic()
            self.active.discard(index)
            if request.outcome == "error_status":
                await asyncio.sleep(0.2)  # 503 while no engine serves: do not spin
        conn.close()

    async def one(self, conn: Conn, body: bytes) -> tuple[str, str]:
        for attempt in range(2):
            reused = conn.is_open and conn.used > 0  # what ensure() keeps is a kept-alive connection
            try:
                # The connect is inside: a connection the kernel queued on the listener of an API server that is then
                # killed (the listeners share the port) is reset, and that is a cut like any other.
                await conn.ensure()
                await conn.send("POST", "/v1/completions", body, accept="text/event-stream")
                status, headers = await conn.read_head()
            except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
                conn.close()
                if reused and attempt == 0:
                    continue  # a keep-alive connection to a process that has gone: once more, on a new one
                return "cut", f"before the status line: {exc!r}"
            try:
                return await self.answer(conn, status, headers)
            except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
                conn.close()
                return "cut", f"mid-stream: {exc!r}"
            except HTTPError as exc:
                # The server's process died mid-body: the connection ends inside the chunked framing.
                eof = conn.reader is not None and conn.reader.at_eof()
                conn.close()
                return ("cut", f"mid-stream, at EOF: {exc}") if eof else ("bad", f"malformed HTTP: {exc}")
        raise AssertionError("unreachable")

    async def answer(self, conn: Conn, status: int, headers: dict[str, str]) -> tuple[str, str]:
        if status != 200:
            text = (await conn.read_body(headers)).decode(errors="replace")
            if headers.get("connection", "").lower() == "close":
                conn.close()
            clean = status >= 500 and '"error"' in text
            return ("error_status" if clean else "bad"), f"{status} {text[:200]}"
        buffer, done, error, finish = b"", False, "", None
        async for piece in conn.chunks(headers):
            buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue  # a keep-alive comment
                data = event[6:]
                if data == b"[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"]["message"]
                for choice in chunk.get("choices", []):
                    finish = choice.get("finish_reason") or finish
        if headers.get("connection", "").lower() == "close":
            conn.close()
        if not done:
            return "bad", "the stream ended without [DONE]"
        if error:
            return "error_event", error[:200]
        return ("ok", str(finish)) if finish else ("bad", "no finish_reason")


async def get_json(port: int, path: str) -> Any:
    """GET on a new connection (the kernel picks the API server), or None if nothing answers."""
    conn = Conn("127.0.0.1", port)
    try:
        return (await asyncio.wait_for(conn.get_json(path), 5))[1]
    except (OSError, TimeoutError, HTTPError, asyncio.IncompleteReadError, json.JSONDecodeError):
        return None
    finally:
        conn.close()


class Mock:
    """One mock engine rank in its own process (benchmarks/soak.py mock-rank), with its stats endpoint."""

    def __init__(self, rank: int, rpc_port: int, log_dir: Path, generation: int = 0) -> None:
        self.rank = rank
        stats_file = log_dir / f"mock-{rank}-{generation}.port"
        args = ["--handshake-address", f"tcp://127.0.0.1:{rpc_port}", "--ranks", str(rank),
                "--step-interval", str(STEP_INTERVAL_S), "--log-level", "WARNING"]  # fmt: skip
        with open(log_dir / f"mock-{rank}-{generation}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(SOAK), "mock-rank", str(stats_file), "--", *args],
                cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.stats_file = stats_file
        self.stats_port = 0

    def wait_stats_port(self, deadline: float) -> None:
        while not self.stats_file.exists():
            assert time.monotonic() < deadline and self.proc.poll() is None, f"mock rank {self.rank} did not start"
            time.sleep(0.1)
        self.stats_port = int(self.stats_file.read_text())

    async def stats(self) -> dict[str, Any]:
        ranks = await get_json(self.stats_port, "/")
        assert ranks, f"mock rank {self.rank}'s stats endpoint does not answer"
        return ranks[0]

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@contextmanager
def deployment(tmp_path: Path) -> Iterator[tuple[int, int, subprocess.Popen, list[Mock]]]:
    port, rpc_port = free_port(), free_port()
    log = open(tmp_path / "pyfront.log", "wb")  # noqa: SIM115
    pyfront = subprocess.Popen(
        [sys.executable, "-m", "pyfront.server.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", MODEL, "--data-parallel-address", "127.0.0.1",
         "--data-parallel-rpc-port", str(rpc_port), "--data-parallel-size", "2", "--api-server-count", "2",
         "--engine-stall-timeout", str(STALL_TIMEOUT_S), "--engine-startup-timeout", "60",
         "--uvicorn-log-level", "warning", "--disable-uvicorn-access-log"],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    mocks = [Mock(rank, rpc_port, tmp_path) for rank in (0, 1)]
    try:
        yield port, rpc_port, pyfront, mocks
    finally:
        for mock in mocks:
            mock.stop()
        if pyfront.poll() is None:
            os.killpg(pyfront.pid, signal.SIGKILL)
            pyfront.wait(10)
        log.close()


async def wait_until(what: str, condition: Any, bound: float = 20.0, poll: float = 0.1) -> float:
    """Seconds until the async `condition()` held; fails after `bound` (a hang guard, not a speed check)."""
    start = time.monotonic()
    while not await condition():
        assert time.monotonic() - start < bound, f"{what}: not within {bound:g} s"
        await asyncio.sleep(poll)
    return time.monotonic() - start


def front_end_in_flight(health: dict[str, Any]) -> int:
    return sum(e["in_flight"] for e in health["engines"])


def ended(fault: Fault) -> str:
    counts = Counter(r.outcome for r in fault.in_flight)
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def time_to_fail(fault: Fault) -> str:
    failed = [r.ended - fault.at for r in fault.in_flight if r.outcome != "ok"]
    return f"the last failed {max(failed):.2f} s after the fault" if failed else "none failed"


def test_engines_and_api_servers_fail_under_load(tmp_path: Path) -> None:
    with deployment(tmp_path) as (port, rpc_port, pyfront, mocks):
        try:
            asyncio.run(chaos(port, rpc_port, pyfront, mocks, tmp_path))
        except BaseException:
            print((tmp_path / "pyfront.log").read_text(errors="replace")[-4000:])
            raise
        # The parent drains and exits 0 on SIGTERM, one API server dead or not.
        os.killpg(pyfront.pid, signal.SIGTERM)
        assert pyfront.wait(60) == 0
    leftovers = subprocess.run(["pgrep", "-g", str(pyfront.pid)], capture_output=True, text=True).stdout.split()
    deadline = time.monotonic() + 10
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.2)
        leftovers = subprocess.run(["pgrep", "-g", str(pyfront.pid)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], f"processes of pyfront's group still running: {leftovers}"
    log_text = (tmp_path / "pyfront.log").read_text(errors="replace")
    assert "Traceback" not in log_text, log_text[-4000:]


async def chaos(port: int, rpc_port: int, pyfront: subprocess.Popen, mocks: list[Mock], log_dir: Path) -> None:
    """The load, the four faults, the checks and the figures; a restarted engine joins `mocks` (stopped with them)."""
    deadline = time.monotonic() + 120
    for mock in mocks:
        await asyncio.to_thread(mock.wait_stats_port, deadline)
    pids: set[int] = set()

    async def both_api_servers_healthy() -> bool:
        assert pyfront.poll() is None, "pyfront exited"
        health = await get_json(port, "/health")
        if health and health.get("healthy") and not health["degraded_ranks"]:
            pids.add(health["pid"])
        return len(pids) == 2

    await wait_until("both API servers healthy", both_api_servers_healthy, bound=120)
    load = Load(port)
    clients = [asyncio.create_task(load.client()) for _ in range(CLIENTS)]
    faults: list[Fault] = []

    def inject(name: str) -> Fault:
        fault = Fault(name, time.monotonic(), load.in_flight())
        faults.append(fault)
        return fault

    await asyncio.sleep(PHASE_S)
    # 1. kill -9 the engine of rank 1; both API servers must name it degraded.
    killed = inject("kill -9 engine rank 1")
    mocks[1].signal(signal.SIGKILL)
    degraded_on: set[int] = set()

    async def degraded_everywhere() -> bool:
        health = await get_json(port, "/health")
        if health and health.get("degraded_ranks") == [1] and health["engines"][1]["status"] == "disconnected":
            degraded_on.add(health["pid"])
        return degraded_on == pids

    killed.extra["degraded in /health after"] = f"{await wait_until('rank 1 degraded', degraded_everywhere):.2f} s"
    await asyncio.sleep(PHASE_S)
    # 2. stall the engine of rank 0: with rank 1 dead, nothing serves until SIGCONT.
    stalled = inject(f"SIGSTOP engine rank 0 for {STALL_S:g} s")
    mocks[0].signal(signal.SIGSTOP)
    await asyncio.sleep(STALL_S)
    mocks[0].signal(signal.SIGCONT)

    async def rank0_back() -> bool:
        health = await get_json(port, "/health")
        return bool(health and health["engines"][0]["status"] == "ok")

    stalled.extra["back in service after SIGCONT"] = f"{await wait_until('rank 0 back', rank0_back):.2f} s"
    await asyncio.sleep(PHASE_S)
    # 3. kill -9 one API server; the other keeps serving on the port.
    victim = sorted(pids)[0]
    api_killed = inject(f"kill -9 API server pid {victim}")
    os.kill(victim, signal.SIGKILL)
    await asyncio.sleep(PHASE_S)
    # 4. rank 1 again, as a new process: re-admitted by the surviving API server, and serving.
    readmit = inject("restart engine rank 1")
    restarted = Mock(1, rpc_port, log_dir, generation=1)
    mocks.append(restarted)

    async def rank1_readmitted() -> bool:
        health = await get_json(port, "/health")
        return bool(health and health["degraded_ranks"] == [] and health["engines"][1]["restarts"] == 1)

    readmit.extra["re-admitted after"] = f"{await wait_until('rank 1 re-admitted', rank1_readmitted):.2f} s"
    readmitted_at = time.monotonic()
    await asyncio.to_thread(restarted.wait_stats_port, time.monotonic() + 20)
    await asyncio.sleep(PHASE_S)
    load.stop = True
    await asyncio.wait_for(asyncio.gather(*clients), REQUEST_BOUND_S + 5)
    restarted_stats = await restarted.stats()

    engines = [mocks[0], restarted]

    async def nothing_running() -> bool:
        stats = [await m.stats() for m in engines]
        health = await get_json(port, "/health")
        return all(s["running"] == 0 for s in stats) and bool(health) and front_end_in_flight(health) == 0

    drained_after = await wait_until("the engines to run nothing", nothing_running, bound=DRAIN_BOUND_S)
    final = [await m.stats() for m in engines]
    health = await get_json(port, "/health")
    leaked = sum(s["running"] for s in final)

    outcomes = Counter(r.outcome for r in load.requests)
    print(f"\nchaos tier: {len(load.requests)} streamed requests, {CLIENTS} clients; outcomes {dict(outcomes)}")
    statuses = Counter(r.detail.split(" ", 1)[0] for r in load.requests if r.outcome == "error_status")
    print(f"error statuses: {dict(statuses)} (503: no engine could take the request)")
    print(f"faults injected: {len(faults)}")
    for fault in faults:
        extra = "".join(f"; {k} {v}" for k, v in fault.extra.items())
        print(f"  {fault.name}: {len(fault.in_flight)} in flight, ended {ended(fault)}; {time_to_fail(fault)}{extra}")
    print(f"restarted rank 1: {restarted_stats['requests']} requests, {restarted_stats['finished']} finished")
    print(f"rank 0: {final[0]['aborts']} aborts received (the stalled engine's requests, and client disconnects)")
    print(f"leaked engine requests: {leaked} (running counts reached 0 {drained_after:.2f} s after the load)")
    print(f"front end: {front_end_in_flight(health)} request(s) in flight at the end")

    bad = [r for r in load.requests if r.outcome in ("hung", "bad")]
    assert not bad, [(r.outcome, r.detail) for r in bad[:10]]
    # Cut connections: only those of the killed API server, in flight then or opened while the kernel still
    # queued connections on its listening socket (the socket closes only as the process is torn down).
    cut = [r for r in load.requests if r.outcome == "cut"]
    window = (api_killed.at, api_killed.at + CUT_WINDOW_S)
    assert all(r.started <= window[1] and r.ended >= window[0] for r in cut), [(r.started, r.detail) for r in cut]
    assert any(r.outcome == "error_event" for r in killed.in_flight), "requests on the killed engine failed cleanly"
    assert any(r.outcome in ("error_event", "error_status") for r in stalled.in_flight)
    assert restarted_stats["finished"] > 0, "the restarted engine took requests again"
    after = [r for r in load.requests if r.started > readmitted_at]
    assert after and all(r.outcome == "ok" for r in after), "after the re-admission every request succeeds"
    assert leaked == 0
