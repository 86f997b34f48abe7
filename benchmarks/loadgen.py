"""Lean load generator for benchmarks/peers.py: raw asyncio HTTP/1.1 (httpconn.py, uvloop when installed), no HTTP
library.

    python benchmarks/loadgen.py SCENARIO --url http://127.0.0.1:PORT --model NAME [options]  -> one JSON object

Scenarios (all against /v1/chat/completions):

- ``warmup``  a few streamed and non-streamed requests, so lazy initialisation is not measured.
- ``streams`` ``--streams N`` connections opened first, then N streamed requests fired at once, each for
  ``--max-tokens`` tokens (``ignore_eos``, ``stream_options.include_usage``). Per stream: the wall time just before
  the request is written, the time of the first SSE event carrying non-empty ``content`` (TTFT), the end, and
  ``usage.completion_tokens`` (``--n`` choices per request: n > 1 samples at temperature 1). SSE bodies are not
  JSON-decoded: the raw bytes are scanned with two regexes, so the client stays cheap.
- ``chat``    one keep-alive connection, one conversation of ``--turns`` turns: every turn appends a user message of
  about ``--turn-tokens`` tokens of English prose (sentences from a fixed corpus, counted with the model's
  tokenizer.json) and the assistant's previous reply; ``--max-tokens`` small. Per turn: send wall time, end, prompt
  tokens, and the request id (sent as ``X-Request-Id``) to match the engine's arrival log.
- ``seq``     one keep-alive connection, ``--requests`` sequential non-streamed requests with ``--max-tokens`` (1).
- ``rps``     ``--concurrency C`` keep-alive connections, each sending short non-streamed requests one after the other
  (``--max-tokens`` 1) until ``--requests`` have been answered in all: requests per second over the window (first
  write -> last response read), latency p50 / p99, and front-end CPU per request. With C well above what the
  front end answers in one engine step, its core is the limit: ``fe_core_busy`` says how close to 1.0 it was.

With ``--fe-pgid`` (and ``--mock-pgid``) the CPU time (utime + stime, plus cutime + cstime of reaped children) of
every process of that process group is read from /proc just before the first request is written and just after the
last response is read; the generator's own CPU (``time.process_time``) over the same window is reported too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools.real_engine, when run as a script

from httpconn import Conn

from tools.real_engine.engine import CLK_TCK, all_proc_stats, group_pids, proc_stat

# --------------------------------------------------------------------------------------------- /proc


def pids_cpu_seconds(pids: list[int]) -> float:
    """utime + stime + cutime + cstime of `pids` (fields 14-17 of /proc/PID/stat), in seconds."""
    ticks = 0
    for pid in pids:
        st = proc_stat(pid)
        if st:
            ticks += st.utime + st.stime + st.cutime + st.cstime
    return ticks / CLK_TCK


def threads_runtime_ns(pids: list[int]) -> dict[tuple[int, int], int]:
    """Nanosecond run time of every thread of `pids` (/proc/PID/task/TID/schedstat, first field)."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    out[(pid, int(tid))] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return out


class GroupCPU:
    """CPU of a process group between `start()` and `stop()`; the pid list is taken before and after the
    window (listing /proc costs a few ms), and pids seen in either list are read at both ends.

    `seconds`: utime + stime (+ cutime + cstime) from /proc/PID/stat, in clock ticks (10 ms here).
    `precise_seconds`: cross-check from per-thread schedstat (ns); threads that end inside the window are missed."""

    def __init__(self, pgid: int | None) -> None:
        self.pgid = pgid
        self.pids: list[int] = group_pids(pgid) if pgid else []
        self.t0 = 0.0
        self.ns0: dict[tuple[int, int], int] = {}
        self.seconds = 0.0
        self.precise_seconds = 0.0

    def start(self) -> None:
        self.ns0 = threads_runtime_ns(self.pids)
        self.t0 = pids_cpu_seconds(self.pids)

    def stop(self) -> float:
        if not self.pgid:
            return 0.0
        t1 = pids_cpu_seconds(self.pids)
        ns1 = threads_runtime_ns(self.pids)
        new = [p for p in group_pids(self.pgid) if p not in self.pids]
        self.seconds = t1 - self.t0 + pids_cpu_seconds(new)  # processes born in the window: all their CPU
        ns1.update(threads_runtime_ns(new))
        self.precise_seconds = sum(v - self.ns0.get(k, 0) for k, v in ns1.items()) / 1e9
        return self.seconds


def all_processes_cpu() -> dict[int, tuple[int, float, str]]:
    """pid -> (pgid, utime + stime in s, comm) for every process."""
    return {pid: (st.pgid, (st.utime + st.stime) / CLK_TCK, st.comm) for pid, st in all_proc_stats()}


def cores_busy_seconds() -> dict[str, float]:
    """Busy time (user+nice+system+irq+softirq+steal) of every core so far, from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *vals = line.split()
                v = [int(x) for x in vals]
                out[name] = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / CLK_TCK
    return out


class Window:
    """CPU of the front end, the mock and this process, and of each core, over the measured window."""

    def __init__(self, fe_pgid: int | None, mock_pgid: int | None) -> None:
        self.fe, self.mock = GroupCPU(fe_pgid), GroupCPU(mock_pgid)

    def start(self) -> None:
        self.procs0 = all_processes_cpu()
        self.cores0 = cores_busy_seconds()
        self.fe.start()
        self.mock.start()
        self.lg0 = time.process_time()
        self.t0 = time.time()

    def stop(self) -> dict[str, Any]:
        self.t1 = time.time()
        lg = time.process_time() - self.lg0
        fe, mock = self.fe.stop(), self.mock.stop()
        cores1 = cores_busy_seconds()
        busy = {k: cores1[k] - self.cores0.get(k, 0.0) for k in cores1}
        ours = {self.fe.pgid, self.mock.pgid, os.getpgid(0)}
        others = []
        for pid, (pgid, cpu, comm) in all_processes_cpu().items():
            if pgid in ours or pid == os.getpid():
                continue
            before = self.procs0.get(pid)
            delta = cpu - before[1] if before else cpu  # born in the window: all of it (approximately)
            if delta > 0:
                others.append((delta, pid, comm))
        others.sort(reverse=True)
        others_cpu = sum(d for d, _, _ in others)
        wall = self.t1 - self.t0
        return {
            "wall_s": wall,
            "fe_cpu_s": fe,
            "fe_cpu_precise_s": self.fe.precise_seconds,
            "mock_cpu_s": mock,
            "loadgen_cpu_s": lg,
            "core_busy": {k: v / wall for k, v in busy.items()} if wall else {},
            # core 0 is the front end's: whatever else ran there in the window disturbed it
            "core0_foreign_busy": max(0.0, busy.get("cpu0", 0.0) - fe) / wall if wall else None,
            "core1_foreign_busy": max(0.0, busy.get("cpu1", 0.0) - mock - lg) / wall if wall else None,
            "others_cpu_s": others_cpu,  # every other process of the machine, in the window
            "other_processes": [f"{comm}[{pid}] {d:.2f}s" for d, pid, comm in others[:4]],
        }


# --------------------------------------------------------------------------------------------- HTTP/1.1


CONTENT_RE = re.compile(rb'"content":\s*"[^"]')
COMPLETION_TOKENS_RE = re.compile(rb'"completion_tokens":\s*(\d+)')
CHUNKED_END = b"\r\n0\r\n\r\n"


async def send_chat(conn: Conn, payload: bytes, request_id: str | None) -> float:
    """Write one /v1/chat/completions request as loadgen writes all of them (`Accept: */*`, the request id as
    X-Request-Id); returns the wall time just before the write, where every latency here starts."""
    await conn.ensure()
    return await conn.send("POST", "/v1/chat/completions", payload, accept="*/*", request_id=request_id)


async def post_chat(conn: Conn, payload: bytes, request_id: str | None = None) -> tuple[float, int, bytes]:
    """One non-streamed chat request, its response read whole: (send wall time, status, body)."""
    sent = await send_chat(conn, payload, request_id)
    status, _, body = await conn.read_response(until_close=True)
    return sent, status, body


# --------------------------------------------------------------------------------------------- text

CORPUS = [
    "The committee met on Tuesday morning to review the budget for the coming year.",
    "Most of the discussion focused on whether the new warehouse should be built before the old one is sold.",
    "Several members argued that the company could not afford both projects at the same time.",
    "Others pointed out that interest rates were likely to rise again before the end of the summer.",
    "In the end, the chair asked the finance team to prepare two detailed plans for the next meeting.",
    "The river runs through the centre of the town and floods the lower streets almost every spring.",
    "Engineers have proposed a series of small dams upstream, but farmers worry about losing their fields.",
    "A public hearing is scheduled for next month, and the council expects a large crowd.",
    "She opened the letter slowly, already guessing what it would say.",
    "The results of the experiment were clear: the second catalyst worked twice as fast as the first.",
    "However, it also produced a small amount of an unwanted by-product that was difficult to remove.",
    "The team decided to repeat the test at a lower temperature to see whether the problem would disappear.",
    "Our train was delayed by forty minutes because of a signal failure near the border.",
    "While we waited, an old man told us stories about the railway as it had been in his childhood.",
    "He remembered steam engines, wooden carriages and a station master who knew every passenger by name.",
    "Good documentation explains not only what a function does, but also why it was written that way.",
    "When a program fails in production, the logs are often the only evidence left behind.",
    "It is usually cheaper to fix a bug during design than after the software has been released.",
    "The library was quiet except for the soft hum of the heating system and the turning of pages.",
    "A student in the corner was copying notes from a thick book about medieval trade routes.",
    "Merchants once carried silk, spices and silver across deserts that took months to cross.",
    "Many of the towns along those routes grew rich, and some of them still keep their old markets.",
    "The weather forecast promised sunshine, but by noon dark clouds had gathered over the hills.",
    "We packed up the picnic quickly and ran back to the car as the first drops began to fall.",
    "Climate scientists collect data from satellites, ocean buoys and thousands of weather stations.",
    "Combining these measurements gives a much more reliable picture than any single source could.",
    "The museum's new exhibition brings together paintings that have never been shown in the same room.",
    "Visitors can follow the artist's career from early sketches to the large canvases of her last years.",
    "Critics have praised the careful lighting, which lets the colours appear as the painter intended.",
    "To make the sauce, melt the butter over a low heat and stir in the flour until the mixture is smooth.",
    "Add the milk a little at a time, whisking constantly so that no lumps can form.",
    "Season with salt, pepper and a pinch of nutmeg, then let it simmer gently for ten minutes.",
    "The hospital has hired twenty new nurses to cope with the increase in patients during the winter.",
    "Waiting times in the emergency department have fallen by almost a third since the spring.",
    "Doctors say the improvement is partly due to a new system for sorting patients on arrival.",
    "Mountain guides recommend starting early, because storms often build up in the afternoon.",
    "The path above the lake is narrow, and in places it crosses loose rock that can move underfoot.",
    "From the summit, on a clear day, it is possible to see three countries and the distant sea.",
    "The startup raised enough money last year to double the size of its engineering team.",
    "Its product helps small shops manage their stock without buying expensive software.",
    "Customers can scan items with a phone, and the system reorders popular goods automatically.",
    "Historians still disagree about the causes of the war, more than a century after it ended.",
    "Some emphasise economic rivalry, while others point to a chain of diplomatic mistakes.",
    "Recently opened archives have added new letters that complicate both explanations.",
    "The orchestra rehearsed the final movement again and again until the timing was perfect.",
    "On the night of the concert, the hall was full, and the audience stood to applaud for several minutes.",
    "Children learn languages most easily when they hear them spoken every day at home.",
    "Schools that teach a second language from an early age report better results in reading as well.",
    "Teachers say that songs and games keep the youngest pupils interested for longer.",
    "The bridge was closed for repairs after inspectors found cracks in two of its supporting columns.",
    "Drivers now have to take a detour of about fifteen kilometres through the neighbouring villages.",
    "Local shop owners complain that fewer customers are stopping on their way through the town.",
    "An efficient database index can turn a query that takes minutes into one that takes milliseconds.",
    "But every index also slows down writes, so it should be added only where it really helps.",
    "Measuring before and after each change is the only reliable way to know what actually improved.",
    "The garden looked different in autumn, with red leaves covering the lawn and the paths.",
    "My grandmother used to collect the apples that fell from the old tree and turn them into jam.",
    "Every jar had a handwritten label with the date and the name of the tree it came from.",
    "The report recommends that the city plant more trees along its busiest streets.",
    "Trees provide shade in summer, absorb rainwater and make walking more pleasant for everyone.",
    "The cost of planting and caring for them is small compared with the benefits they bring.",
    "A good night's sleep improves memory, mood and the ability to concentrate on difficult tasks.",
    "Researchers found that people who slept less than six hours made more mistakes in simple tests.",
    "Reducing screen time in the evening seems to help many people fall asleep more quickly.",
    "The ship left the harbour at dawn, its sails filling slowly as the wind picked up.",
    "For three days the crew saw nothing but water, until a line of cliffs appeared on the horizon.",
    "They anchored in a small bay and sent a boat ashore to look for fresh water.",
    "The new policy will take effect on the first of January and applies to all full-time employees.",
    "Staff who have questions about the changes should contact the human resources department.",
    "A short guide explaining the most important points will be sent to everyone by email.",
    "Bees play a vital role in pollinating crops, yet their numbers have declined in many regions.",
    "Farmers are experimenting with strips of wild flowers between fields to give the insects food.",
    "Early results suggest that the strips also attract birds that feed on harmful pests.",
    "The negotiations lasted late into the night, and both sides left the building looking tired.",
    "A spokesperson said that progress had been made, but that several issues remained unresolved.",
    "Talks are expected to resume next week in a different city.",
    "Reading old newspapers is a fascinating way to understand how people lived in the past.",
    "Advertisements, letters to the editor and small notices reveal details that history books leave out.",
    "One paper from 1912 describes the excitement when the first motor car arrived in the village.",
]


def english_messages(tokenizer_json: str, count: int, tokens_each: int, seed: int = 1234) -> list[str]:
    """`count` user messages of about `tokens_each` tokens each: paragraphs of 3-7 corpus sentences."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    rng = random.Random(seed)
    sentence_tokens = [len(tok.encode(" " + s, add_special_tokens=False).ids) for s in CORPUS]
    out = []
    for i in range(count):
        paragraphs: list[str] = []
        total = 0
        opener = f"Here is part {i + 1} of the notes; please keep it in mind for the questions that follow."
        current = [opener]
        total += len(tok.encode(opener, add_special_tokens=False).ids)
        target = rng.randint(3, 7)
        while total < tokens_each:
            k = rng.randrange(len(CORPUS))
            current.append(CORPUS[k])
            total += sentence_tokens[k] + 1
            if len(current) >= target:
                paragraphs.append(" ".join(current))
                current, target = [], rng.randint(3, 7)
        if current:
            paragraphs.append(" ".join(current))
        text = "\n\n".join(paragraphs)
        while len(tok.encode(text, add_special_tokens=False).ids) < tokens_each:  # the estimate runs high
            text += " " + CORPUS[rng.randrange(len(CORPUS))]
        out.append(text)
    return out


# --------------------------------------------------------------------------------------------- scenarios


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def body(model: str, messages: list[dict], max_tokens: int, stream: bool, n: int = 1) -> bytes:
    b: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if n > 1:  # several choices need sampling: greedy n > 1 is refused, as vLLM refuses it
        b["n"], b["temperature"] = n, 1.0
    if stream:
        b["stream_options"] = {"include_usage": True}
    return json.dumps(b).encode()


async def one_stream(host: str, port: int, conn: Conn | None, payload: bytes, rid: str) -> dict[str, Any]:
    if conn is None:
        conn = Conn(host, port)
        await conn.open()
    rec: dict[str, Any] = {"id": rid}
    try:
        sent = await send_chat(conn, payload, rid)
        status, headers = await conn.read_head()
        rec["status"] = status
        if status != 200:
            rec["error"] = (await conn.read_body(headers, until_close=True))[:500].decode(errors="replace")
            return rec
        first = None
        parts: list[bytes] = []
        tail = b""
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        reader = conn.reader
        assert reader is not None
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            parts.append(data)
            if first is None:
                window = tail + data
                if CONTENT_RE.search(window):
                    first = time.time()
            tail = (tail + data)[-16:]
            if chunked and tail.endswith(CHUNKED_END):
                break
            if not chunked and b"[DONE]" in tail:
                break
        end = time.time()
        raw = b"".join(parts)
        usage = COMPLETION_TOKENS_RE.findall(raw)
        rec.update(
            sent=sent,
            ttft=(first - sent) if first else None,
            latency=end - sent,
            tokens=int(usage[-1]) if usage else None,
            events=raw.count(b"data:"),
            done=b"[DONE]" in raw,
        )
    except Exception as exc:  # reported per request
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return rec


async def scenario_streams(a: argparse.Namespace, host: str, port: int) -> dict[str, Any]:
    conns = [Conn(host, port) for _ in range(a.streams)]
    await asyncio.gather(*(c.open() for c in conns))
    payloads = [
        body(a.model, [{"role": "user", "content": f"Stream {i}: {CORPUS[i % len(CORPUS)]}"}], a.max_tokens, True, a.n)
        for i in range(a.streams)
    ]
    win = Window(a.fe_pgid, a.mock_pgid)
    win.start()
    recs = await asyncio.gather(
        *(
            one_stream(host, port, c, p, f"{a.tag}s{i:05d}")
            for i, (c, p) in enumerate(zip(conns, payloads, strict=True))
        )
    )
    w = win.stop()
    ok = [r for r in recs if "error" not in r]
    tokens = sum(r["tokens"] or 0 for r in ok)
    ttfts = [r["ttft"] for r in ok if r.get("ttft") is not None]
    return {
        "scenario": "streams",
        "streams": a.streams,
        "max_tokens": a.max_tokens,
        "ok": len(ok),
        "errors": [r for r in recs if "error" in r][:5],
        "n_errors": len(recs) - len(ok),
        "short_streams": sum(1 for r in ok if (r["tokens"] or 0) != a.max_tokens * a.n),
        "no_done": sum(1 for r in ok if not r["done"]),
        "tokens": tokens,
        **w,
        "fe_cpu_s_per_1k_tokens": w["fe_cpu_s"] / tokens * 1000 if tokens else None,
        "ttft_p50_s": pct(ttfts, 0.5),
        "ttft_p90_s": pct(ttfts, 0.9),
        "ttft_min_s": min(ttfts) if ttfts else None,
        "ttft_max_s": max(ttfts) if ttfts else None,
        "latency_p50_s": pct([r["latency"] for r in ok], 0.5),
        "core1_busy": (w["loadgen_cpu_s"] + w["mock_cpu_s"]) / w["wall_s"] if w["wall_s"] else None,
        "records": [[r["id"], r.get("sent"), r.get("ttft")] for r in recs],
    }


async def scenario_chat(a: argparse.Namespace, host: str, port: int) -> dict[str, Any]:
    messages_text = english_messages(a.tokenizer_json, a.turns, a.turn_tokens)
    conn = Conn(host, port)
    await conn.open()
    win = Window(a.fe_pgid, a.mock_pgid)
    win.start()
    history: list[dict[str, str]] = []
    turns = []
    for k in range(1, a.turns + 1):
        history.append({"role": "user", "content": messages_text[k - 1]})
        payload = body(a.model, history, a.max_tokens, False)
        rid = f"{a.tag}c{k:04d}"
        sent, status, resp = await post_chat(conn, payload, rid)
        end = time.time()
        rec: dict[str, Any] = {"turn": k, "id": rid, "sent": sent, "latency": end - sent, "status": status,
                               "body_bytes": len(payload)}  # fmt: skip
        if status != 200:
            rec["error"] = resp[:500].decode(errors="replace")
            turns.append(rec)
            break
        doc = json.loads(resp)
        reply = doc["choices"][0]["message"].get("content") or ""
        rec["prompt_tokens"] = doc.get("usage", {}).get("prompt_tokens")
        history.append({"role": "assistant", "content": reply})
        turns.append(rec)
        if a.think_time:
            await asyncio.sleep(a.think_time)
    w = win.stop()
    conn.close()
    return {"scenario": "chat", "turns": turns, "n_errors": sum(1 for t in turns if "error" in t), **w}


async def scenario_seq(a: argparse.Namespace, host: str, port: int) -> dict[str, Any]:
    conn = Conn(host, port)
    await conn.open()
    payloads = [
        body(a.model, [{"role": "user", "content": CORPUS[i % len(CORPUS)]}], a.max_tokens, False)
        for i in range(a.requests)
    ]
    win = Window(a.fe_pgid, a.mock_pgid)
    win.start()
    lat, errors, reconnects, sent_ids = [], [], 0, []
    for i, payload in enumerate(payloads):
        if not conn.is_open:
            reconnects += 1
        rid = f"{a.tag}q{i:05d}"
        sent, status, resp = await post_chat(conn, payload, rid)
        sent_ids.append([rid, sent])
        lat.append(time.time() - sent)
        if status != 200:
            errors.append(resp[:300].decode(errors="replace"))
    w = win.stop()
    conn.close()
    n = len(payloads)
    return {
        "scenario": "seq",
        "requests": n,
        "n_errors": len(errors),
        "errors": errors[:3],
        "reconnects": reconnects,
        "latency_p50_s": pct(lat, 0.5),
        "latency_p90_s": pct(lat, 0.9),
        "latency_mean_s": statistics.fmean(lat),
        **w,
        "fe_cpu_s_per_request": w["fe_cpu_s"] / n,
        "fe_cpu_precise_s_per_request": w["fe_cpu_precise_s"] / n,
        "records": sent_ids,
    }


async def scenario_rps(a: argparse.Namespace, host: str, port: int) -> dict[str, Any]:
    conns = [Conn(host, port) for _ in range(a.concurrency)]
    for conn in conns:
        await conn.open()
    payloads = [
        body(a.model, [{"role": "user", "content": CORPUS[i % len(CORPUS)]}], a.max_tokens, False)
        for i in range(len(CORPUS))
    ]
    remaining = a.requests
    lat: list[float] = []
    errors: list[str] = []
    reconnects = 0

    async def worker(w: int, conn: Conn) -> None:
        nonlocal remaining, reconnects
        i = 0
        while remaining > 0:
            remaining -= 1
            if not conn.is_open:
                reconnects += 1
            sent, status, resp = await post_chat(conn, payloads[(w + i) % len(payloads)], f"{a.tag}p{w:03d}{i:05d}")
            i += 1
            lat.append(time.time() - sent)
            if status != 200:
                errors.append(resp[:300].decode(errors="replace"))

    win = Window(a.fe_pgid, a.mock_pgid)
    win.start()
    await asyncio.gather(*(worker(w, conn) for w, conn in enumerate(conns)))
    w = win.stop()
    for conn in conns:
        conn.close()
    n = len(lat)
    return {
        "scenario": "rps",
        "requests": n,
        "concurrency": a.concurrency,
        "n_errors": len(errors),
        "errors": errors[:3],
        "reconnects": reconnects,
        "rps": n / w["wall_s"],
        "latency_p50_s": pct(lat, 0.5),
        "latency_p99_s": pct(lat, 0.99),
        **w,
        "fe_core_busy": w["fe_cpu_s"] / w["wall_s"],
        "fe_cpu_s_per_request": w["fe_cpu_s"] / n,
    }


async def scenario_warmup(a: argparse.Namespace, host: str, port: int) -> dict[str, Any]:
    out = []
    for i in range(4):
        out.append(await one_stream(host, port, None, body(a.model, [{"role": "user", "content": CORPUS[i]}], 8, True),
                                    f"{a.tag}w{i:03d}"))  # fmt: skip
    conn = Conn(host, port)
    for i in range(4):
        _, status, resp = await post_chat(conn, body(a.model, [{"role": "user", "content": CORPUS[i]}], 4, False))
        out.append({"status": status, "body": resp[:200].decode(errors="replace")})
    conn.close()
    recs = await asyncio.gather(
        *(one_stream(host, port, None, body(a.model, [{"role": "user", "content": CORPUS[i]}], 16, True),
                     f"{a.tag}v{i:03d}") for i in range(16))
    )  # fmt: skip
    out.extend(recs)
    bad = [r for r in out if r.get("status") != 200 or "error" in r]
    return {"scenario": "warmup", "requests": len(out), "errors": bad[:3], "n_errors": len(bad)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=("warmup", "streams", "chat", "seq", "rps"))
    p.add_argument("--url", required=True, help="http://HOST:PORT")
    p.add_argument("--model", required=True)
    p.add_argument("--fe-pgid", type=int, default=None, help="front end's process group, for its CPU")
    p.add_argument("--mock-pgid", type=int, default=None, help="mock engine's process group, for its CPU")
    p.add_argument("--tag", default="pb", help="request-id prefix")
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--turn-tokens", type=int, default=2000)
    p.add_argument("--think-time", type=float, default=0.05, help="pause between chat turns, s")
    p.add_argument("--tokenizer-json", default=None, help="tokenizer.json used to size the chat messages")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=64, help="rps: connections sending at once")
    p.add_argument("--n", type=int, default=1, help="streams: choices per request (n > 1 samples, temperature 1)")
    a = p.parse_args(argv)
    m = re.match(r"http://([^:/]+):(\d+)", a.url)
    if not m:
        p.error("--url must be http://HOST:PORT")
    if a.scenario == "chat" and not a.tokenizer_json:
        p.error("chat needs --tokenizer-json")
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    host, port = m.group(1), int(m.group(2))
    fn = {"warmup": scenario_warmup, "streams": scenario_streams, "chat": scenario_chat, "seq": scenario_seq,
          "rps": scenario_rps}  # fmt: skip
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(fn[a.scenario](a, host, port))
    result["loop"] = "uvloop" if loop_factory else "asyncio"
    result["affinity"] = sorted(os.sched_getaffinity(0))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
