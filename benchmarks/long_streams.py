"""Long streams with logprobs: does the server stay responsive, turn disconnects into aborts and obey SIGTERM?

    python benchmarks/long_streams.py [--streams 6] [--tokens 8000] [--step-interval 0.0025]

Issue 13's first finding, as a script: a few concurrent streams with ``logprobs`` against an engine producing
400 tokens/s each (the mock engine, one token per stream every 2.5 ms) froze the whole server after ~5k tokens
per stream. This starts ``pyfront serve --mock-engine`` (bundled tokenizer), opens ``--streams`` streaming
completions (``logprobs: 1, max_tokens: --tokens, ignore_eos``), and while they run polls ``GET /health``
every 0.2 s on a connection of its own. When the streams have reached ``--tokens`` * 0.8 tokens (or
``--disconnect-after`` seconds) the clients all disconnect (RST); the script then waits for ``/health``'s
engines[].in_flight to reach 0, and finally sends SIGTERM and times the exit.

Printed: /health latency (median, p99, max) in four quarters of the run, tokens per second per stream in
those quarters, time from the disconnects to in_flight 0, time from SIGTERM to exit. No figure is asserted:
a server that starves its loop shows it as /health latencies of seconds and a late or missing abort.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from httpconn import Conn

REPO = Path(__file__).resolve().parent.parent
MODEL = "pyfront/qwen3-tokenizer"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_ready(port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = Conn("127.0.0.1", port)
            status, _ = await conn.get_json("/ready")
            conn.close()
            if status == 200:
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit("pyfront did not become ready")


class Stream:
    def __init__(self, port: int, tokens: int) -> None:
        self.conn = Conn("127.0.0.1", port)
        self.tokens = tokens
        self.received: list[tuple[float, int]] = []  # (time, tokens so far) per event
        self.count = 0

    async def run(self) -> None:
        body = {"model": MODEL, "prompt": "Tell me a story.", "stream": True, "logprobs": 1,
                "max_tokens": self.tokens, "ignore_eos": True}  # fmt: skip
        await self.conn.open()
        await self.conn.send("POST", "/v1/completions", json.dumps(body).encode(), accept="text/event-stream")
        _, headers = await self.conn.read_head()
        async for piece in self.conn.chunks(headers):
            self.count += piece.count(b'"text_offset"')
            self.received.append((time.monotonic(), self.count))


async def poll_health(port: int, samples: list[tuple[float, float]], stop: asyncio.Event) -> None:
    conn = Conn("127.0.0.1", port)
    while not stop.is_set():
        start = time.monotonic()
        await conn.get_json("/health")
        samples.append((start, time.monotonic() - start))
        await asyncio.sleep(0.2)
    conn.close()


async def in_flight(port: int) -> int:
    conn = Conn("127.0.0.1", port)
    _, report = await conn.get_json("/health")
    conn.close()
    return sum(e["in_flight"] for e in report["engines"])


def quarters(values: list[tuple[float, float]], start: float, end: float) -> list[list[float]]:
    out: list[list[float]] = [[], [], [], []]
    span = max(end - start, 1e-9)
    for t, v in values:
        out[min(3, max(0, int((t - start) / span * 4)))].append(v)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--step-interval", type=float, default=0.0025)
    parser.add_argument("--disconnect-after", type=float, default=None, help="seconds; default: at 80%% of --tokens")
    args = parser.parse_args()

    port = free_port()
    mock_args = f"--step-interval {args.step_interval} --output-len {args.tokens * 2}"
    server = subprocess.Popen(
        [sys.executable, "-m", "pyfront.server.cli", "serve", "--mock-engine", "--port", str(port),
         "--mock-engine-args", mock_args],
        cwd=REPO, env={**os.environ, "VLLM_NATIVE_FEH": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        await wait_ready(port)
        streams = [Stream(port, args.tokens) for _ in range(args.streams)]
        samples: list[tuple[float, float]] = []
        stop = asyncio.Event()
        poller = asyncio.create_task(poll_health(port, samples, stop))
        start = time.monotonic()
        tasks = [asyncio.create_task(s.run()) for s in streams]
        target = int(args.tokens * 0.8)
        limit = args.disconnect_after if args.disconnect_after is not None else args.tokens / 400 * 3
        while time.monotonic() - start < limit and min(s.count for s in streams) < target:
            await asyncio.sleep(0.1)
        disconnect_at = time.monotonic()
        for s, t in zip(streams, tasks, strict=True):
            t.cancel()
            s.conn.close(reset=True)
        await asyncio.gather(*tasks, return_exceptions=True)
        stop.set()
        await poller
        drained = None
        while time.monotonic() - disconnect_at < 30:
            if await in_flight(port) == 0:
                drained = time.monotonic() - disconnect_at
                break
            await asyncio.sleep(0.05)
        term_at = time.monotonic()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
            exit_s: float | None = time.monotonic() - term_at
        except subprocess.TimeoutExpired:
            exit_s = None

        print(f"{args.streams} streams, logprobs=1, engine step {args.step_interval * 1000:g} ms "
              f"({1 / args.step_interval:.0f} tokens/s per stream), ran {disconnect_at - start:.1f} s")  # fmt: skip
        print(f"tokens per stream at the disconnect: {sorted(s.count for s in streams)}")
        print("quarter   /health median   p99      max     samples   tokens/s per stream")
        for i, q in enumerate(quarters(samples, start, disconnect_at)):
            q_start = start + (disconnect_at - start) * i / 4
            q_end = start + (disconnect_at - start) * (i + 1) / 4
            rates = []
            for s in streams:
                inside = [n for t, n in s.received if q_start <= t < q_end]
                if len(inside) > 1:
                    rates.append((inside[-1] - inside[0]) / (q_end - q_start))
            if q:
                q.sort()
                p99 = q[min(len(q) - 1, int(len(q) * 0.99))]
                rate = statistics.median(rates) if rates else 0
                print(f"  {i + 1}       {statistics.median(q) * 1000:8.1f} ms {p99 * 1000:8.1f} ms "
                      f"{q[-1] * 1000:8.1f} ms {len(q):6d}    {rate:8.0f}")  # fmt: skip
            else:
                print(f"  {i + 1}       no /health answer in this quarter")
        print(f"disconnect -> engine in_flight 0: {'never (30 s)' if drained is None else f'{drained * 1000:.0f} ms'}")
        print(f"SIGTERM -> exit: {'no exit in 30 s' if exit_s is None else f'{exit_s:.2f} s'}")
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


if __name__ == "__main__":
    asyncio.run(main())
