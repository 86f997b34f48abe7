"""What server/http_limits.py costs per request: uvicorn's httptools protocol against pyfront's limited one.

    python benchmarks/http_limits_bench.py [--seconds 5] [--connections 8] [--repeats 3] [--body-bytes 0]

Each run starts this script as a server process (`serve PROTOCOL PORT`: uvicorn with uvloop, the given protocol,
an ASGI app that reads the body and answers 2 bytes, so the protocol is nearly all the work), pinned to core 0
when `taskset` exists, and drives it from this process (pinned to core 1) with `--connections` keep-alive
connections (httpconn.py's client) sending GET requests (or POSTs of `--body-bytes`) back to back for `--seconds`.
The two protocols alternate, `--repeats` times each. Printed: requests/s and the server's CPU time per request
(utime+stime from /proc/PID/stat), medians over the repeats, and the difference in microseconds per request.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from httpconn import Conn  # noqa: E402

from tools.real_engine.engine import free_port  # noqa: E402


async def _app(scope: dict, receive: object, send: object) -> None:
    """Read the request body, answer b"ok"."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()  # type: ignore[operator]
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


def serve(protocol: str, port: int) -> None:
    import uvicorn

    from pyfront.server.config import ServerConfig
    from pyfront.server.http_limits import ReadLimits, protocol_class

    http: object = "httptools" if protocol == "plain" else protocol_class(ReadLimits.from_config(ServerConfig()))
    uvicorn.run(_app, host="127.0.0.1", port=port, loop="uvloop", http=http, log_level="warning", access_log=False)  # type: ignore[arg-type]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(port: int, seconds: float, connections: int, body: bytes | None) -> int:
    deadline = time.monotonic() + seconds
    done = 0

    async def one_connection() -> None:
        nonlocal done
        conn = Conn("127.0.0.1", port)
        await conn.ensure()
        while time.monotonic() < deadline:
            await conn.send("POST" if body is not None else "GET", "/", body)
            status, _, _ = await conn.read_response()
            assert status == 200, status
            done += 1
        conn.close()

    await asyncio.gather(*(one_connection() for _ in range(connections)))
    return done


def run_once(protocol: str, args: argparse.Namespace) -> tuple[float, float]:
    """(requests/s, server CPU microseconds per request) for one server process."""
    port = free_port()
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([*pin, sys.executable, __file__, "serve", protocol, str(port)], env=env)
    try:
        body = b"x" * args.body_bytes if args.body_bytes else None
        started = time.monotonic() + 30
        while True:
            try:
                asyncio.run(_load(port, 0.2, 1, body))  # also the warm-up
                break
            except OSError:
                if time.monotonic() > started:
                    raise
                time.sleep(0.1)
        cpu_before, wall_before = _cpu_s(server.pid), time.monotonic()
        requests = asyncio.run(_load(port, args.seconds, args.connections, body))
        cpu, wall = _cpu_s(server.pid) - cpu_before, time.monotonic() - wall_before
        return requests / wall, cpu / requests * 1e6
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--body-bytes", type=int, default=0, help="POST bodies of this size (0: GET, no body)")
    args = p.parse_args()
    if shutil.which("taskset"):
        os.sched_setaffinity(0, {1})
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "limited": []}
    for _ in range(args.repeats):
        for protocol in results:
            results[protocol].append(run_once(protocol, args))
    medians = {}
    for protocol, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        medians[protocol] = (rate, cpu)
        print(f"{protocol:8s} {rate:9.0f} req/s   server CPU {cpu:6.1f} us/request   (runs: "
              + ", ".join(f"{r:.0f}/s {c:.1f} us" for r, c in runs) + ")")  # fmt: skip
    (plain_rate, plain_cpu), (limited_rate, limited_cpu) = medians["plain"], medians["limited"]
    cpu_change, rate_change = (limited_cpu / plain_cpu - 1) * 100, (limited_rate / plain_rate - 1) * 100
    print(f"limited - plain: {limited_cpu - plain_cpu:+.1f} us of server CPU per request ({cpu_change:+.1f} %), "
          f"{rate_change:+.1f} % req/s")  # fmt: skip


if __name__ == "__main__":
    main()
