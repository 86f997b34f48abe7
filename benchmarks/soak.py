"""Soak: N minutes of mixed load, with random client disconnects, against pyfront serving 2 mock engines.

    python benchmarks/soak.py [--minutes 10] [--clients 32] [--seed 1] [--step-interval 0.01] [--json FILE]

Everything runs on 127.0.0.1, and each process runs in its own session:

- pyfront: `python -m pyfront.server.cli serve --data-parallel-size 2 --data-parallel-rpc-port P ...` with
  VLLM_NATIVE_FEH=1 and the bundled tokenizer;
- two mock engines, one process per rank (`--ranks 0` and `--ranks 1`), connected to the same handshake
  port. Each process is this script re-run as `soak.py mock-rank STATS_PORT_FILE -- MOCK_ENGINE_ARGS`: it
  runs `pyfront.engine_client.mock_engine`'s own MockEngine, configured by the mock's own argument parser and
  advertising FEH, plus a loopback HTTP endpoint that returns the rank's `stats()`. Those are the counters
  that the `mock_stats` utility returns. The utility itself can only be called by the front end that owns
  the engine connection, and pyfront exposes no route for it.

The load comes from `--clients` concurrent clients (httpconn.py's raw asyncio HTTP/1.1 client with keep-alive,
so disconnects are real socket closes). Each runs a loop bounded in time (`--minutes`) and in count
(`--max-requests` in total). Every request is drawn at random: chat or completions, streamed or not, a
random max_tokens (mostly short, a few up to 1024), stop strings on some, n=2 and logprobs on a few,
multi-turn chats that grow (so the FEH prefix memo is hit), and a few prompts of thousands of tokens. About
`--disconnect-fraction` (20 %) of the streams are abandoned, by FIN or by RST, either right after the
request is sent or after a random number of events. About 3 % of the non-streamed requests are abandoned
too.

Every completed response is checked: the status, the JSON, SSE framing and `[DONE]`, one finish_reason
per choice, no stop string in the output, and usage consistent with max_tokens. Anything else counts as
an error, by kind. No kind of error is expected: the client stays far below `--max-num-seqs-in-flight`,
so even 503s are errors.

After the load, in-flight work is read three ways, and each must reach 0 within `--drain-timeout`:
1. the mocks' own `running` counter, the requests the engines are still generating for (authoritative);
2. pyfront's `GET /health` -> `engines[].in_flight`, the requests the front end has outstanding per engine;
3. pyfront's `GET /metrics` -> `vllm:num_requests_running`, set from the front end's open streams.
`/health`'s `engines[].running` is only printed: it is the engine's last scheduler-stats report, and an
abort sends no new report, so it can stay stale after the last request was aborted.

RSS (VmRSS, pyfront's process and its children; the mocks separately) is printed at start, after warm-up,
every minute and at the end. The script exits 1 if anything is still in flight at the end, if an
unexpected error occurred, if pyfront logged a traceback, if a mock saw a mismatched block hash, or if
pyfront did not exit 0 on SIGTERM. `--json FILE` writes the summary's figures as JSON too (the soak test tier,
tests/tiers/test_soak.py, reads them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tools.real_engine, when run as a script

from httpconn import Conn, HTTPError  # noqa: E402

from tools.real_engine.engine import all_proc_stats, free_port, rss_bytes  # noqa: E402

MODEL = "soak"
EXPECTED_ERRORS: frozenset[str] = frozenset()  # none: every error kind seen is a failure
# Texts the mock's whole-word tokens produce (" the", " model", " and", " of", ...): some stop strings
# match often, some rarely, one never.
STOP_STRINGS = [" of", " the model", " and the", "model", " is a", "zzqx-never"]
WORDS = [
    "the", "model", "and", "a", "to", "of", "in", "is", "that", "for", "on", "with", "as", "which", "by", "at",
    "from", "this", "be", "are", "can", "it", "was", "an", "or", "not", "have", "system", "request", "token",
    "engine", "prefix", "cache", "block", "hash", "stream", "server", "client", "vector", "kernel", "batch",
    "latency",
]  # fmt: skip


# ------------------------------------------------------------------------------------------ mock rank


def run_mock_rank(stats_port_file: str, mock_argv: list[str]) -> None:
    """One mock engine process: MockEngine + a loopback endpoint serving its ranks' stats() as JSON."""
    from pyfront.engine_client.mock_engine import MockEngine, default_none_hash, parse_args

    config = parse_args(mock_argv)
    if config.advertise_feh and config.feh_none_hash is None:
        config.feh_none_hash = default_none_hash()  # as mock_engine.main() does
    engine = MockEngine(config).start()

    class Stats(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(engine.stats()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stats)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tmp = stats_port_file + ".tmp"
    Path(tmp).write_text(str(server.server_address[1]))
    os.replace(tmp, stats_port_file)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    while not stop.wait(0.5):
        if os.getppid() != parent:  # the soak script is gone: do not outlive it
            break
    server.shutdown()
    engine.stop()


# ------------------------------------------------------------------------------------------ processes


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for pid, st in all_proc_stats():
        tree.setdefault(st.ppid, []).append(pid)
    return tree


def tree_rss_mb(pid: int) -> float:
    """VmRSS of `pid` and all its descendants, in MB."""
    tree, total, todo = _children(), 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(tree.get(p, []))
        total += rss_bytes(p)
    return total / 2**20


def stop_process(proc: subprocess.Popen, timeout: float = 45.0) -> int | None:
    """SIGTERM the process (its session leader), wait; SIGKILL the group if it does not go."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    return proc.returncode


# ------------------------------------------------------------------------------------------ load


@dataclass
class Results:
    requests: Counter = field(default_factory=Counter)  # completed, by shape
    disconnects: Counter = field(default_factory=Counter)  # by mode
    errors: Counter = field(default_factory=Counter)  # by kind
    error_examples: dict[str, str] = field(default_factory=dict)
    completion_tokens: int = 0
    stale_keepalive_retries: int = 0
    started: int = 0

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        self.error_examples.setdefault(kind, detail[:300])


class Failure(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class Client:
    def __init__(self, index: int, port: int, seed: int, args: argparse.Namespace, results: Results) -> None:
        self.rng = random.Random(seed * 1000 + index)
        self.conn = Conn("127.0.0.1", port)
        self.args = args
        self.results = results
        self.history: list[dict[str, str]] = []

    def words(self, low: int, high: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(low, high)))

    def draw(self) -> tuple[str, dict[str, Any]]:
        rng = self.rng
        roll = rng.random()
        max_tokens = (
            rng.randint(1, 48) if roll < 0.7 else rng.randint(49, 256) if roll < 0.95 else rng.randint(257, 1024)
        )
        body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "stream": rng.random() < 0.7}
        if rng.random() < 0.3:
            body["stop"] = rng.sample(STOP_STRINGS, rng.randint(1, 2))
        if rng.random() < 0.05:
            body["n"] = 2
        if body["stream"] and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        long_prompt = rng.random() < 0.04
        if rng.random() < 0.6:
            if not self.history or len(self.history) > 24 or rng.random() < 0.15:
                self.history = [{"role": "system", "content": "You are a soak test. " + self.words(5, 60)}]
            self.history.append(
                {"role": "user", "content": self.words(2000, 5000) if long_prompt else self.words(3, 300)}
            )
            body["messages"] = list(self.history)
            if rng.random() < 0.05:
                body["logprobs"], body["top_logprobs"] = True, 2
            return "/v1/chat/completions", body
        body["prompt"] = self.words(2000, 5000) if long_prompt else self.words(1, 400)
        if rng.random() < 0.05:
            body["logprobs"] = 2
        return "/v1/completions", body

    async def run(self, deadline: float) -> None:
        while time.monotonic() < deadline and self.results.started < self.args.max_requests:
            self.results.started += 1
            path, body = self.draw()
            try:
                async with asyncio.timeout(self.args.request_timeout):
                    await self.one(path, body)
            except Failure as exc:
                self.results.error(exc.kind, str(exc))
                self.conn.close()
            except TimeoutError:
                self.results.error("timeout", f"{path} {json.dumps(body)[:200]}")
                self.conn.close()
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                self.results.error("connection_lost", f"{type(exc).__name__}: {exc}")
                self.conn.close()
            except HTTPError as exc:
                self.results.error("bad_http", str(exc))
                self.conn.close()
        self.conn.close()

    async def one(self, path: str, body: dict[str, Any]) -> None:
        rng = self.rng
        payload = json.dumps(body).encode()
        disconnect: str | None = None
        if body["stream"] and rng.random() < self.args.disconnect_fraction:
            disconnect = "stream_after_send" if rng.random() < 0.2 else "stream_mid"
        elif not body["stream"] and rng.random() < 0.03:
            disconnect = "nonstream_gave_up"
        reset = rng.random() < 0.5
        for attempt in (0, 1):
            await self.conn.ensure()
            reused = self.conn.used > 0
            await self.conn.send("POST", path, payload)
            if disconnect == "stream_after_send":
                self.conn.close(reset)
                self.results.disconnects[f"{disconnect}/{'rst' if reset else 'fin'}"] += 1
                return
            if disconnect == "nonstream_gave_up":
                await asyncio.sleep(rng.uniform(0, 0.3))
                self.conn.close(reset)
                self.results.disconnects[f"{disconnect}/{'rst' if reset else 'fin'}"] += 1
                return
            try:
                status, headers = await self.conn.read_head()
                break
            except ConnectionResetError:
                # The server closed an idle keep-alive connection as we reused it: retry once, fresh.
                self.conn.close()
                if not reused or attempt:
                    raise
                self.results.stale_keepalive_retries += 1
        if status != 200:
            text = (await self.conn.read_body(headers)).decode(errors="replace")
            raise Failure(f"http_{status}", text)
        if body["stream"]:
            await self.stream(
                body, headers, cut=rng.randint(0, body["max_tokens"]) if disconnect else None, reset=reset
            )
        else:
            self.check_full(body, json.loads(await self.conn.read_body(headers)))
        if headers.get("connection", "").lower() == "close":
            self.conn.close()

    async def stream(self, body: dict[str, Any], headers: dict[str, str], cut: int | None, reset: bool) -> None:
        if not headers.get("content-type", "").startswith("text/event-stream"):
            raise Failure("content_type", headers.get("content-type", ""))
        chat = "messages" in body
        n = body.get("n", 1)
        texts = [""] * n
        finishes: list[str | None] = [None] * n
        usage: dict[str, Any] | None = None
        done = False
        events = 0
        buffer = b""
        async for piece in self.conn.chunks(headers):
            buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if event.startswith(b":"):
                    continue  # keep-alive comment
                if not event.startswith(b"data: "):
                    raise Failure("bad_sse", event[:200].decode(errors="replace"))
                data = event[6:]
                if done:
                    raise Failure("bad_sse", "data after [DONE]")
                if data == b"[DONE]":
                    done = True
                    continue
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    raise Failure("bad_json", data[:200].decode(errors="replace")) from None
                if "error" in chunk:
                    raise Failure("sse_error_event", json.dumps(chunk)[:300])
                events += 1
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices", []):
                    i = choice["index"]
                    piece_text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    texts[i] += piece_text or ""
                    if choice.get("finish_reason") is not None:
                        if finishes[i] is not None:
                            raise Failure("finish_twice", json.dumps(chunk)[:300])
                        finishes[i] = choice["finish_reason"]
                if cut is not None and events >= cut:
                    self.conn.close(reset)
                    self.results.disconnects[f"stream_mid/{'rst' if reset else 'fin'}"] += 1
                    return
        if cut is not None:  # the stream ended before the planned disconnect point: a normal completion
            self.results.disconnects["stream_mid/too_late"] += 1
        if not done:
            raise Failure("sse_no_done", f"{events} events, finishes {finishes}")
        self.check(body, texts, finishes, usage, streamed=True)

    def check_full(self, body: dict[str, Any], response: dict[str, Any]) -> None:
        chat = "messages" in body
        n = body.get("n", 1)
        choices = sorted(response.get("choices", []), key=lambda c: c["index"])
        if len(choices) != n:
            raise Failure("choices", f"{len(choices)} choices, want {n}")
        texts = [(c["message"]["content"] if chat else c["text"]) or "" for c in choices]
        self.check(body, texts, [c.get("finish_reason") for c in choices], response.get("usage"), streamed=False)

    def check(
        self, body: dict[str, Any], texts: list[str], finishes: list[str | None], usage: Any, streamed: bool
    ) -> None:
        for finish in finishes:
            if finish not in ("stop", "length"):
                raise Failure("finish_reason", f"finish_reason {finish!r}")
        for text in texts:
            for stop in body.get("stop", []):
                if stop in text:
                    raise Failure("stop_string_in_output", f"{stop!r} in {text[-120:]!r}")
        want_usage = not streamed or bool(body.get("stream_options"))
        if want_usage:
            if not usage:
                raise Failure("usage_missing", "no usage")
            tokens = usage["completion_tokens"]
            n, max_tokens = len(finishes), body["max_tokens"]
            if tokens > n * max_tokens or (all(f == "length" for f in finishes) and tokens != n * max_tokens):
                raise Failure(
                    "usage_mismatch", f"completion_tokens {tokens}, n {n}, max_tokens {max_tokens}, {finishes}"
                )
            self.results.completion_tokens += tokens
        if "messages" in body and self.history and body["messages"][-1] is self.history[-1]:
            self.history.append({"role": "assistant", "content": texts[0]})
        shape = f"{'chat' if 'messages' in body else 'completions'}/{'stream' if streamed else 'full'}"
        self.results.requests[shape] += 1


# ------------------------------------------------------------------------------------------ observation


async def observe(port: int, stats_ports: list[int]) -> dict[str, Any]:
    conn = Conn("127.0.0.1", port)
    try:
        _, health = await conn.get_json("/health")
        _, metrics = await conn.get_json("/metrics")
    finally:
        conn.close()
    running_metric = 0.0
    for line in metrics.decode().splitlines():
        if line.startswith("vllm:num_requests_running"):
            running_metric += float(line.rsplit(None, 1)[1])
    mocks: list[dict[str, Any]] = []
    for stats_port in stats_ports:
        mconn = Conn("127.0.0.1", stats_port)
        try:
            _, ranks = await mconn.get_json("/")
        finally:
            mconn.close()
        mocks.extend(ranks)
    engines = health.get("engines", []) if isinstance(health, dict) else []
    return {
        "mock_running": sum(m["running"] for m in mocks),
        "health_in_flight": sum(e["in_flight"] for e in engines),
        "metrics_running": running_metric,
        "health_engine_running": [e["running"] for e in engines],
        "healthy": bool(isinstance(health, dict) and health.get("healthy")),
        "feh": health.get("front_end_block_hashing") if isinstance(health, dict) else None,
        "mocks": mocks,
    }


def in_flight_zero(obs: dict[str, Any]) -> bool:
    return obs["mock_running"] == 0 and obs["health_in_flight"] == 0 and obs["metrics_running"] == 0


async def main_async(args: argparse.Namespace, port: int, stats_ports: list[int], pyfront: subprocess.Popen,
                     mocks: list[subprocess.Popen]) -> dict[str, Any]:  # fmt: skip
    results = Results()
    rss: list[tuple[str, float, float]] = []

    def sample(label: str) -> None:
        rss.append((label, tree_rss_mb(pyfront.pid), sum(tree_rss_mb(m.pid) for m in mocks)))
        print(f"  rss {label:>12}: pyfront {rss[-1][1]:7.1f} MB   mocks {rss[-1][2]:7.1f} MB", flush=True)

    first = await observe(port, stats_ports)
    print(f"front-end block hashing: {first['feh']}", flush=True)
    sample("start")
    started = time.monotonic()
    deadline = started + args.minutes * 60
    clients = [Client(i, port, args.seed, args, results) for i in range(args.clients)]
    tasks = [asyncio.create_task(c.run(deadline)) for c in clients]
    warmup_at = started + min(60.0, args.minutes * 60 / 4)
    next_minute = started + 60
    warm_sampled = False
    while not all(t.done() for t in tasks):
        await asyncio.sleep(1)
        now = time.monotonic()
        if not warm_sampled and now >= warmup_at:
            sample("warm-up")
            warm_sampled = True
        if now >= next_minute:
            served = sum(results.requests.values())
            errors = sum(results.errors.values())
            print(f"  t={now - started:5.0f}s served {served} (+{sum(results.disconnects.values())} abandoned), "
                  f"errors {errors}", flush=True)  # fmt: skip
            sample(f"{(now - started) / 60:.0f} min")
            next_minute += 60
        for proc, name in [(pyfront, "pyfront"), *((m, f"mock {i}") for i, m in enumerate(mocks))]:
            if proc.poll() is not None:
                results.error("process_died", f"{name} exited with {proc.returncode} during the load")
                for t in tasks:
                    t.cancel()
                break
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
    load_seconds = time.monotonic() - started
    drain_started = time.monotonic()
    obs = await observe(port, stats_ports)
    while not in_flight_zero(obs) and time.monotonic() - drain_started < args.drain_timeout:
        await asyncio.sleep(0.2)
        obs = await observe(port, stats_ports)
    drain_seconds = time.monotonic() - drain_started
    sample("end")
    return {"results": results, "rss": rss, "obs": obs, "load_seconds": load_seconds, "drain_seconds": drain_seconds}


def report(out: dict[str, Any], pyfront_exit: int | None, log_text: str, args: argparse.Namespace) -> int:
    results: Results = out["results"]
    obs = out["obs"]
    served = sum(results.requests.values())
    abandoned = sum(results.disconnects.values()) - results.disconnects["stream_mid/too_late"]
    print("\n=== soak summary ===")
    print(f"load: {out['load_seconds']:.0f} s, {args.clients} clients, seed {args.seed}")
    print(f"requests served (completed and checked): {served}  ({served / out['load_seconds']:.1f}/s)")
    for shape, count in sorted(results.requests.items()):
        print(f"  {shape:<20} {count}")
    print(f"completion tokens in checked usage: {results.completion_tokens}")
    print(f"client disconnects: {abandoned}")
    for mode, count in sorted(results.disconnects.items()):
        print(f"  {mode:<28} {count}")
    print(f"stale keep-alive retries (not errors): {results.stale_keepalive_retries}")
    unexpected = {k: v for k, v in results.errors.items() if k not in EXPECTED_ERRORS}
    print(f"errors by kind (expected kinds: {sorted(EXPECTED_ERRORS) or 'none'}): "
          f"{dict(results.errors) or 'none'}")  # fmt: skip
    for kind in sorted(results.errors):
        print(f"  {kind} ({'expected' if kind in EXPECTED_ERRORS else 'UNEXPECTED'}), e.g.: "
              f"{results.error_examples[kind]}")  # fmt: skip
    tracebacks = log_text.count("Traceback (most recent call last)")
    error_lines = [line for line in log_text.splitlines() if " ERROR " in line]
    print(f"pyfront log: {tracebacks} traceback(s), {len(error_lines)} ERROR line(s)")
    for line in error_lines[:5]:
        print(f"  {line[:200]}")
    print("RSS (VmRSS, MB):")
    for label, fe, mock in out["rss"]:
        print(f"  {label:>12}: pyfront+children {fe:7.1f}   mocks {mock:7.1f}")
    (_, fe_start, _), (_, fe_end, _) = out["rss"][0], out["rss"][-1]
    warm = next((fe for label, fe, _ in out["rss"] if label == "warm-up"), fe_start)
    print(f"  pyfront: start {fe_start:.1f} -> end {fe_end:.1f} MB ({fe_end - warm:+.1f} MB since warm-up)")
    print(f"in flight at the end (after {out['drain_seconds']:.1f} s of drain):")
    print(f"  mocks' own running counters:         {obs['mock_running']}")
    print(f"  pyfront /health engines[].in_flight: {obs['health_in_flight']}")
    print(f"  pyfront /metrics num_requests_running: {obs['metrics_running']:g}")
    print(f"  (/health engines[].running, last engine report, informative: {obs['health_engine_running']})")
    mocks = obs["mocks"]
    print("mock ranks: " + "; ".join(
        f"rank {m['rank']}: {m['requests']} requests, {m['finished']} finished, {m['aborts']} aborts, "
        f"hashes used {m['hashes_used']} missing {m['hashes_missing']} mismatched {m['hashes_mismatched']}"
        for m in mocks
    ))  # fmt: skip
    print(f"pyfront exit code on SIGTERM: {pyfront_exit}")
    failures = []
    if not in_flight_zero(obs):
        failures.append("requests still in flight")
    if unexpected:
        failures.append(f"unexpected errors {unexpected}")
    if tracebacks:
        failures.append("tracebacks in pyfront's log")
    if any(m["hashes_mismatched"] for m in mocks):
        failures.append("mismatched block hashes")
    if pyfront_exit != 0:
        failures.append(f"pyfront exit code {pyfront_exit}")
    if served == 0:
        failures.append("nothing served")
    print("RESULT: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
    if args.json:
        summary = {
            "load_seconds": out["load_seconds"], "clients": args.clients, "served": served,
            "requests_by_shape": dict(results.requests), "completion_tokens": results.completion_tokens,
            "disconnects": abandoned, "errors": dict(results.errors), "unexpected_errors": unexpected,
            "tracebacks": tracebacks, "error_lines": len(error_lines),
            "rss_mb": [{"label": label, "pyfront": fe, "mocks": mock} for label, fe, mock in out["rss"]],
            "rss_growth_since_warmup_mb": fe_end - warm,
            "in_flight": {"mocks_running": obs["mock_running"], "health_in_flight": obs["health_in_flight"],
                          "metrics_running": obs["metrics_running"]},
            "drain_seconds": out["drain_seconds"],
            "mock_ranks": mocks, "pyfront_exit": pyfront_exit, "failures": failures,
        }  # fmt: skip
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if not failures else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["mock-rank"]:
        run_mock_rank(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-requests", type=int, default=500_000, help="bound on requests started, in total")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds before a request is an error")
    p.add_argument("--disconnect-fraction", type=float, default=0.2, help="share of streams abandoned")
    p.add_argument("--step-interval", type=float, default=0.01, help="mock engine seconds per step")
    p.add_argument("--output-len", type=int, default=300, help="mock emits EOS after this many tokens")
    p.add_argument("--drain-timeout", type=float, default=20.0)
    p.add_argument("--log-dir", default=None, help="keep the process logs here (default: a temp dir, removed)")
    p.add_argument("--json", default=None, help="also write the summary's figures to this file, as JSON")
    args = p.parse_args(argv)

    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="pyfront-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    port, rpc_port = free_port(), free_port()
    env = {**os.environ, "VLLM_NATIVE_FEH": "1", "PYTHONPATH": str(ROOT)}
    pyfront_log = open(log_dir / "pyfront.log", "wb")  # noqa: SIM115
    pyfront = subprocess.Popen(
        [sys.executable, "-m", "pyfront.server.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", MODEL, "--data-parallel-address", "127.0.0.1",
         "--data-parallel-rpc-port", str(rpc_port), "--data-parallel-size", "2", "--uvicorn-log-level", "warning",
         "--engine-startup-timeout", "120"],
        cwd=ROOT, env=env, stdout=pyfront_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    mocks: list[subprocess.Popen] = []
    stats_files = [log_dir / f"mock-{rank}.port" for rank in (0, 1)]
    pyfront_exit: int | None = None
    try:
        for rank, stats_file in enumerate(stats_files):
            mock_args = ["--handshake-address", f"tcp://127.0.0.1:{rpc_port}", "--ranks", str(rank),
                         "--step-interval", str(args.step_interval), "--output-len", str(args.output_len),
                         "--advertise-feh", "--log-level", "WARNING"]  # fmt: skip
            with open(log_dir / f"mock-{rank}.log", "wb") as log:
                mocks.append(subprocess.Popen(
                    [sys.executable, __file__, "mock-rank", str(stats_file), "--", *mock_args],
                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                ))  # fmt: skip
        deadline = time.monotonic() + 180
        while not (all(f.exists() for f in stats_files) and _healthy(port)):
            if time.monotonic() > deadline or pyfront.poll() is not None or any(m.poll() is not None for m in mocks):
                print((log_dir / "pyfront.log").read_text()[-3000:])
                print("RESULT: FAIL: the server did not become healthy")
                return 1
            time.sleep(0.2)
        stats_ports = [int(f.read_text()) for f in stats_files]
        print(f"pyfront on 127.0.0.1:{port} (pid {pyfront.pid}), 2 mock engines on rpc port {rpc_port} "
              f"(pids {[m.pid for m in mocks]}); {args.minutes:g} min, {args.clients} clients; logs in {log_dir}",
              flush=True)  # fmt: skip
        with contextlib.suppress(ImportError):
            import uvloop  # a cheaper client leaves more of the 2 cores to the server

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        out = asyncio.run(main_async(args, port, stats_ports, pyfront, mocks))
        pyfront_exit = stop_process(pyfront)
    finally:
        if pyfront_exit is None:
            stop_process(pyfront, 10)
        for mock in mocks:
            stop_process(mock, 10)
        pyfront_log.close()
    code = report(out, pyfront_exit, (log_dir / "pyfront.log").read_text(errors="replace"), args)
    if args.log_dir is None and code == 0:
        for f in log_dir.iterdir():
            f.unlink()
        log_dir.rmdir()
    elif code:
        print(f"logs kept in {log_dir}")
    return code


def _healthy(port: int) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


if __name__ == "__main__":
    sys.exit(main())
