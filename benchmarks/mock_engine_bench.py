"""Is the mock engine fast enough not to be a benchmark's bottleneck? 256 streams x 256 tokens.

Usage: python benchmarks/mock_engine_bench.py [--streams 256] [--tokens 256] [--step 0.02] [--repeats 3]

Drives the mock engine (its own process) with pyfront's engine client (no HTTP) and prints, per run:
wall time against the ideal (tokens x step interval), the mock's CPU seconds (from /proc) and its
share of one core. A mock that keeps up finishes close to the ideal and stays well below one core.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pyfront.engine_client.client import EngineClient, EngineClientConfig
from pyfront.engine_client.protocol import EngineCoreRequest, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools.real_engine, when run as a script

from tools.real_engine.engine import CLK_TCK, free_port, proc_stat


def cpu_seconds(pid: int) -> float:
    """utime + stime of the running process `pid`."""
    st = proc_stat(pid)
    if st is None:
        raise ProcessLookupError(pid)
    return (st.utime + st.stime) / CLK_TCK


async def run_once(streams: int, tokens: int, step: float) -> tuple[float, float, int]:
    port = free_port()
    mock = subprocess.Popen(
        [sys.executable, "-m", "pyfront.engine_client.mock_engine", "--handshake-address", f"tcp://127.0.0.1:{port}",
         "--ranks", "0", "--step-interval", str(step), "--log-level", "WARNING"]
    )  # fmt: skip
    try:
        client = await EngineClient.start(
            EngineClientConfig(data_parallel_rpc_port=port, startup_timeout_s=30, feh_enabled=False)
        )
        try:
            params = SamplingParams(max_tokens=tokens, ignore_eos=True)
            cpu_before = cpu_seconds(mock.pid)
            started = time.monotonic()
            handles = []
            for i in range(streams):
                request = EngineCoreRequest(f"b{i}", list(range(100, 164)), None, params, None, time.time(), None,
                                            None, None)  # fmt: skip
                handles.append(await client.add_request(request))

            async def drain(stream) -> int:
                return sum([len(o.new_token_ids) async for o in stream])

            counts = await asyncio.gather(*(drain(h) for h in handles))
            wall = time.monotonic() - started
            cpu = cpu_seconds(mock.pid) - cpu_before
            return wall, cpu, sum(counts)
        finally:
            await client.close()
    finally:
        mock.terminate()
        mock.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--step", type=float, default=0.02)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ideal = args.tokens * args.step
    print(f"{args.streams} streams x {args.tokens} tokens, step {args.step * 1e3:.0f} ms; ideal wall {ideal:.2f} s")
    walls, cpus = [], []
    for i in range(args.repeats):
        wall, cpu, total = asyncio.run(run_once(args.streams, args.tokens, args.step))
        assert total == args.streams * args.tokens, total
        walls.append(wall)
        cpus.append(cpu)
        print(f"run {i + 1}: wall {wall:.2f} s ({wall / ideal:.2f}x ideal), mock CPU {cpu:.2f} s "
              f"= {cpu / wall:.0%} of one core, {total / wall:,.0f} tokens/s")  # fmt: skip
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"median: wall {wall:.2f} s ({wall / ideal:.2f}x ideal), mock CPU {cpu / wall:.0%} of one core, "
          f"{cpu / (args.streams * args.tokens) * 1e6:.1f} us of mock CPU per token")  # fmt: skip


if __name__ == "__main__":
    main()
