"""What the HTTP layer alone costs per request: uvicorn + a minimal ASGI app against a bare httptools protocol.

    python benchmarks/http_layer.py [--rounds 3] [--requests 5000]

Two servers answer every POST with the same fixed 115-byte JSON body, nothing else:

- ``asgi``: ``uvicorn.run(app, loop="uvloop", http="httptools")`` with uvicorn's defaults otherwise (its proxy
  headers middleware included, access log off) and an ASGI app that reads the body and sends the response in two
  messages, as every ASGI application does;
- ``raw``: an asyncio protocol on uvloop that feeds httptools and writes the response from ``on_message_complete``.

Each round starts each server in turn on core 0 (``taskset``) and sends it ``--requests`` sequential keep-alive
requests (after 500 unmeasured) from a blocking client on core 1, the same 268-byte chat request pyfront's
sequential row sends. Printed per round: the server's CPU per request (its threads' schedstat, nanoseconds) and
the client's latency p50; then the medians and the difference. The difference bounds what a protocol of pyfront's
own could save on each short request; pyfront's request path adds its limits, its response cycle and its
middleware on top of the ``asgi`` figure (benchmarks/README.md, stop 33).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.real_engine import engine as eng  # noqa: E402

BODY = (
    b'{"id":"chatcmpl-x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":"hi"}}]}'
)

ASGI_SERVER = f"""
import sys, uvicorn
BODY = {BODY!r}
HEADERS = [(b"content-length", str(len(BODY)).encode()), (b"content-type", b"application/json")]
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({{"type": "http.response.start", "status": 200, "headers": HEADERS}})
    await send({{"type": "http.response.body", "body": BODY}})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools", access_log=False,
            log_level="warning")
"""

RAW_SERVER = f"""
import asyncio, sys, uvloop, httptools
BODY = {BODY!r}
RESPONSE = b"HTTP/1.1 200 OK\\r\\ncontent-length: %d\\r\\ncontent-type: application/json\\r\\n\\r\\n" % len(BODY) + BODY
class Protocol(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.parser, self.headers, self.body = transport, httptools.HttpRequestParser(self), [], b""
    def data_received(self, data):
        self.parser.feed_data(data)
    def on_url(self, url):
        self.url = url
    def on_header(self, name, value):
        self.headers.append((name.lower(), value))
    def on_body(self, body):
        self.body += body
    def on_message_complete(self):
        self.transport.write(RESPONSE)
        self.headers, self.body = [], b""
async def main():
    server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
uvloop.install()
asyncio.run(main())
"""

REQUEST_BODY = b'{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":1,"temperature":0}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    b"x-request-id: bench\r\ncontent-length: %d\r\n\r\n" % len(REQUEST_BODY)
) + REQUEST_BODY


def runtime_ns(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
            total += int(f.read().split()[0])
    return total


def measure(port: int, pid: int, requests: int) -> tuple[float, float]:
    """(server CPU per request, latency p50), in seconds."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def one() -> None:
        sock.sendall(REQUEST)
        buf = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("the server closed the connection")
            buf += chunk
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if sep:
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))  # fmt: skip
                if len(rest) >= length:
                    return

    for _ in range(500):
        one()
    before = runtime_ns(pid)
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        one()
        latencies.append(time.perf_counter() - started)
    cpu = (runtime_ns(pid) - before) / 1e9 / requests
    sock.close()
    return cpu, statistics.median(latencies)


def run_server(source: str, requests: int) -> tuple[float, float]:
    port = eng.free_port()
    proc = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", source, str(port)], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.05)
        return measure(port, proc.pid, requests)
    finally:
        eng.stop_group(proc.pid, grace=5, proc=proc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=5000)
    args = p.parse_args()
    os.sched_setaffinity(0, {1})  # the client on core 1, the servers on core 0
    results: dict[str, list[tuple[float, float]]] = {"asgi": [], "raw": []}
    for rnd in range(args.rounds):
        for name, source in (("asgi", ASGI_SERVER), ("raw", RAW_SERVER)):
            round_cpu, round_p50 = run_server(source, args.requests)
            results[name].append((round_cpu, round_p50))
            print(f"round {rnd + 1} {name}: CPU per request {round_cpu * 1e6:.1f} us, latency p50 "
                  f"{round_p50 * 1e6:.0f} us", flush=True)  # fmt: skip
    cpu = {name: statistics.median(c for c, _ in rows) for name, rows in results.items()}
    p50 = {name: statistics.median(lat for _, lat in rows) for name, rows in results.items()}
    print(f"medians: asgi {cpu['asgi'] * 1e6:.1f} us CPU, {p50['asgi'] * 1e6:.0f} us p50; raw "
          f"{cpu['raw'] * 1e6:.1f} us CPU, {p50['raw'] * 1e6:.0f} us p50; the ASGI layer costs "
          f"{(cpu['asgi'] - cpu['raw']) * 1e6:.1f} us of CPU per request "
          f"({cpu['asgi'] / cpu['raw']:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
