"""One long agent conversation sent three ways: what each turn costs the front end as the history grows (issue 17).

    python benchmarks/agent_turns.py [--turns 50] [--turn-tokens 2000] [--max-tokens 8] [--out DIR]

The conversation is loadgen.py's ``chat`` scenario (the "multi-turn" row of peers.py): every turn adds a user
message of ~``--turn-tokens`` tokens of English prose, and the assistant's reply stays in the history; ~100k tokens
at turn 50. It is sent three ways, each to a fresh ``pyfront serve --enable-responses-store`` (FEH on, the bundled
Qwen3 tokenizer) and a fresh mock engine (``--step-on-arrival --arrival-log FILE``), so that no way warms the
caches of another:

- ``chat``:            POST /v1/chat/completions with the whole history every turn (what agents send today);
- ``responses-full``:  POST /v1/responses with the whole history as input items, ``store: false``;
- ``responses-prev``:  POST /v1/responses with the new user message only and the previous turn's
  ``previous_response_id`` (the history is the server's).

Per turn: the wall time just before the request is written -> the engine's ADD (the mock's arrival log; the turn's
``X-Request-Id`` is inside the engine request id). Printed side by side: turns 1, 10, 25 and the last, the median of
the last 10 turns, and each way's ratio to ``chat``; the request body's size at the last turn. One keep-alive
connection, one request at a time, greedy, ``--max-tokens`` output tokens. Raw records and logs go to ``--out``.
Figures, not assertions: the machine's noise is in them (report medians and ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools.real_engine, when run as a script
sys.path.insert(0, str(Path(__file__).resolve().parent))  # httpconn, loadgen

from httpconn import Conn
from loadgen import english_messages

from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME, resolve_tokenizer_name
from tools.real_engine import engine as eng

WAYS = ("chat", "responses-full", "responses-prev")
MODEL = "agent-model"


def start(way: str, out: Path) -> tuple[eng.Handle, eng.Handle, Path]:
    """A fresh mock engine and pyfront for one way; returns (pyfront, mock, the mock's arrival log)."""
    rpc, http = eng.free_port(), eng.free_port()
    arrivals = out / f"{way}-arrivals.log"
    arrivals.unlink(missing_ok=True)
    mock = eng._spawn(
        "mock",
        [sys.executable, "-m", "pyfront.engine_client.mock_engine", "--handshake-address", f"tcp://127.0.0.1:{rpc}",
         "--ranks", "0", "--step-interval", "0.002", "--max-model-len", "262144", "--advertise-feh",
         "--step-on-arrival", "--arrival-log", str(arrivals)],
        out / f"{way}-mock.log", rpc, None, None, True,
    )  # fmt: skip
    pyfront = eng._spawn(
        "pyfront",
        [sys.executable, "-m", "pyfront.server.cli", "serve", BUNDLED_TOKENIZER_NAME, "--served-model-name", MODEL,
         "--host", "127.0.0.1", "--port", str(http), "--data-parallel-address", "127.0.0.1",
         "--data-parallel-rpc-port", str(rpc), "--max-model-len", "262144", "--enable-responses-store",
         "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"],
        out / f"{way}-pyfront.log", rpc, http, {"VLLM_NATIVE_FEH": "1"}, True,
    )  # fmt: skip
    eng.wait_healthy(pyfront, timeout=120, also_alive=[mock])
    return pyfront, mock, arrivals


def request(way: str, texts: list[str], replies: list[str], previous: str | None, max_tokens: int) -> tuple[str, bytes]:
    """The path and body of the next turn (the last of `texts` is the new user message)."""
    common: dict[str, Any] = {"model": MODEL, "temperature": 0}
    if way == "chat":
        messages: list[dict[str, str]] = []
        for k, text in enumerate(texts):
            messages.append({"role": "user", "content": text})
            if k < len(replies):
                messages.append({"role": "assistant", "content": replies[k]})
        return "/v1/chat/completions", json.dumps({**common, "messages": messages, "max_tokens": max_tokens}).encode()
    body: dict[str, Any] = {**common, "max_output_tokens": max_tokens}
    if way == "responses-full":
        items: list[dict[str, Any]] = []
        for k, text in enumerate(texts):
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
            if k < len(replies):
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": replies[k]}]})  # fmt: skip
        body.update(input=items, store=False)
    else:
        body["input"] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": texts[-1]}]}]
        if previous is not None:
            body["previous_response_id"] = previous
    return "/v1/responses", json.dumps(body).encode()


def reply_of(way: str, doc: dict[str, Any]) -> tuple[str, str | None]:
    """The assistant's text and (Responses) the response id."""
    if way == "chat":
        return doc["choices"][0]["message"].get("content") or "", None
    text = "".join(part.get("text", "") for item in doc["output"] if item.get("type") == "message"
                   for part in item.get("content") or [])  # fmt: skip
    return text, doc["id"]


async def run_way(way: str, messages: list[str], max_tokens: int, out: Path) -> list[dict[str, Any]]:
    pyfront, mock, arrivals = start(way, out)
    assert pyfront.http_port is not None
    records: list[dict[str, Any]] = []
    try:
        conn = Conn("127.0.0.1", pyfront.http_port)
        await conn.open()
        replies: list[str] = []
        previous: str | None = None
        for turn in range(1, len(messages) + 1):
            path, payload = request(way, messages[:turn], replies, previous, max_tokens)
            rid = f"agentturn{way.replace('-', '')}{turn:04d}"
            await conn.ensure()
            sent = await conn.send("POST", path, payload, accept="application/json", request_id=rid)
            status, _, body = await conn.read_response()
            if status != 200:
                raise RuntimeError(f"{way} turn {turn}: HTTP {status} {body[:500]!r}")
            doc = json.loads(body)
            reply, previous = reply_of(way, doc)
            replies.append(reply)
            usage = doc.get("usage") or {}
            prompt_tokens = usage.get("prompt_tokens", usage.get("input_tokens"))
            records.append({"turn": turn, "id": rid, "sent": sent, "body_bytes": len(payload),
                            "prompt_tokens": prompt_tokens})  # fmt: skip
        conn.close()
    finally:
        eng.stop(pyfront)
        eng.stop(mock)
    adds: dict[str, float] = {}
    for line in arrivals.read_text().splitlines():
        wall, _, engine_id = line.split()[:3]
        for rec in records:
            if rec["id"] in engine_id:
                adds.setdefault(rec["id"], float(wall))
    for rec in records:
        rec["add_ms"] = (adds[rec["id"]] - rec["sent"]) * 1000 if rec["id"] in adds else None
    (out / f"{way}.json").write_text(json.dumps(records, indent=1))
    return records


def table(results: dict[str, list[dict[str, Any]]], turns: int) -> str:
    def at(way: str, turn: int) -> float | None:
        recs = [r for r in results[way] if r["turn"] == turn]
        return recs[0]["add_ms"] if recs else None

    def tail(way: str) -> float | None:
        values = [r["add_ms"] for r in results[way][-10:] if r["add_ms"] is not None]
        return statistics.median(values) if values else None

    def fmt(value: float | None, spec: str = ".2f") -> str:
        return "-" if value is None else format(value, spec)

    rows: list[tuple[str, dict[str, str]]] = []
    for turn in sorted({1, min(10, turns), min(25, turns), turns}):
        tokens = next((r["prompt_tokens"] for r in next(iter(results.values())) if r["turn"] == turn), None)
        label = f"request -> ADD (ms), turn {turn}" + (f" ({tokens:,} prompt tokens)" if tokens else "")
        rows.append((label, {w: fmt(at(w, turn)) for w in results}))
    rows.append((f"median of the last {min(10, turns)} turns (ms)", {w: fmt(tail(w)) for w in results}))
    if "chat" in results and tail("chat"):
        rows.append(("  ratio to chat", {w: fmt((tail(w) or 0) / tail("chat"), ".2f") for w in results}))  # type: ignore[operator]
    rows.append(("request body at the last turn (KiB)",
                 {w: fmt(results[w][-1]["body_bytes"] / 1024, ".1f") for w in results}))  # fmt: skip
    prompts = {w: [r["prompt_tokens"] for r in results[w]] for w in results}
    reference = next(iter(prompts.values()))
    same = {w: "yes" if p == reference else "NO" for w, p in prompts.items()}
    rows.append(("prompt tokens equal at every turn", same))
    ways = list(results)
    width = max(len(label) for label, _ in rows)
    lines = ["| " + "figure".ljust(width) + " | " + " | ".join(w.ljust(14) for w in ways) + " |",
             "|" + "-" * (width + 2) + "|" + "|".join("-" * 16 for _ in ways) + "|"]  # fmt: skip
    for label, cells in rows:
        lines.append("| " + label.ljust(width) + " | " + " | ".join(cells[w].ljust(14) for w in ways) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--turn-tokens", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {','.join(WAYS)}")
    p.add_argument("--out", type=Path, default=None, help="raw records and logs (default: a temporary directory)")
    a = p.parse_args(argv)
    ways = [w for w in a.ways.split(",") if w]
    if unknown := set(ways) - set(WAYS):
        p.error(f"unknown ways: {sorted(unknown)}")
    out = a.out or Path(tempfile.mkdtemp(prefix="agent-turns-"))
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_json = str(Path(resolve_tokenizer_name(BUNDLED_TOKENIZER_NAME)) / "tokenizer.json")
    messages = english_messages(tokenizer_json, a.turns, a.turn_tokens)
    print(f"{a.turns} turns of ~{a.turn_tokens} tokens each, {a.max_tokens} output tokens; logs and records in {out}")
    results: dict[str, list[dict[str, Any]]] = {}
    for way in ways:
        started = time.monotonic()
        results[way] = asyncio.run(run_way(way, messages, a.max_tokens, out))
        print(f"  {way}: {len(results[way])} turns in {time.monotonic() - started:.0f} s", flush=True)
    print(table(results, a.turns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
