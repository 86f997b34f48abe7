"""Routing through the real EngineClient against mock engines: approximate and explicit ranks, load mode.

The index and the policy have their own tests (test_prefix_index.py, test_routing.py); these check the wiring:
which engine each turn of a conversation reaches, what /health says, what the metrics count.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pyfront.engine_client.client import EngineClient
from pyfront.engine_client.protocol import EngineCoreRequest, SamplingParams
from pyfront.engine_client.routing import RoutingConfig
from tests.conftest import free_port
from tests.engine_client.test_engine_client import EOS, client_for, collect, mock_threads

BLOCK = 16


def request(request_id: str, prompt: list[int], max_tokens: int = 2) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=max_tokens, eos_token_id=EOS)
    return EngineCoreRequest(request_id, prompt, None, params, None, time.time(), None, None, None)


def conversation(seed: int, turns: int, turn_tokens: int = 300) -> list[list[int]]:
    """Prompts of one conversation: each turn's prompt extends the previous one."""
    prompts, history = [], []
    for turn in range(turns):
        history = history + [1000 + (seed * 7919 + turn * 131 + i * 37) % 30000 for i in range(turn_tokens)]
        prompts.append(list(history))
    return prompts


async def send(client: EngineClient, request_id: str, prompt: list[int], **kw: int | None) -> int:
    stream = await client.add_request(request(request_id, prompt), **kw)  # type: ignore[arg-type]
    await collect(stream)
    return stream.rank


def test_approximate_routing_keeps_each_conversation_on_its_engine() -> None:
    """No KV events: pyfront's record of where it sent each prompt brings every later turn back there."""
    port = free_port()

    async def main() -> None:
        # 64 tokens per unit of load: a turn's 300 new tokens of cached history outweigh a request more in flight.
        async with client_for(port, 2, feh_enabled=False, routing=RoutingConfig(load_weight=64)) as client:
            health = client.health()
            assert health["routing"]["policy"] == "cache"
            for engine in health["engines"]:
                assert engine["routing"]["mode"] == "approximate" and engine["routing"]["approximate"]
                assert "no KV events" in engine["routing"]["reason"]
            convs = [conversation(seed, 5) for seed in range(4)]
            homes: dict[int, set[int]] = {c: set() for c in range(4)}
            for turn in range(5):
                ranks = await asyncio.gather(*(send(client, f"c{c}-t{turn}", convs[c][turn]) for c in range(4)))
                for c, rank in enumerate(ranks):
                    homes[c].add(rank)
            assert all(len(h) == 1 for h in homes.values()), homes
            assert {next(iter(h)) for h in homes.values()} == {0, 1}, "the conversations spread over both engines"
            stats = client.routing_stats
            assert stats.decisions.get(("cache", "approximate"), 0) >= 4 * 4 - 2
            assert client.health()["engines"][0]["routing"]["blocks"] > 0

    with mock_threads(port, [0, 1], step_interval_s=0.002):
        asyncio.run(main())


def test_explicit_rank_wins_and_is_checked() -> None:
    port = free_port()

    async def main() -> None:
        async with client_for(port, 2, feh_enabled=False) as client:
            prompt = conversation(1, 1)[0]
            pinned = request("b", prompt)
            pinned.data_parallel_rank = 1
            stream = await client.add_request(pinned)
            await collect(stream)
            assert stream.rank == 1
            assert await send(client, "c", prompt, rank=0) == 0
            with pytest.raises(ValueError, match=r"out of range \[0, 2\)"):
                await client.add_request(request("d", prompt), rank=2)
            assert client.routing_stats.decisions[("explicit", "none")] == 2

    with mock_threads(port, [0, 1], step_interval_s=0.002):
        asyncio.run(main())


def test_load_routing_alternates_and_keeps_no_index() -> None:
    port = free_port()

    async def main() -> None:
        async with client_for(port, 2, feh_enabled=False, routing=RoutingConfig(policy="load")) as client:
            prompt = conversation(2, 1, 600)[0]
            ranks = [await send(client, f"r{i}", prompt) for i in range(4)]
            assert sorted(ranks) == [0, 0, 1, 1]
            health = client.health()
            assert health["routing"]["policy"] == "load"
            assert all(e["routing"]["mode"] == "off" for e in health["engines"])
            assert client.routing_stats.decisions == {("load", "none"): 4}
            report = client.routing_report()
            assert report.policy == "load" and all(e.mode == "off" for e in report.engines)

    with mock_threads(port, [0, 1], step_interval_s=0.002):
        asyncio.run(main())
