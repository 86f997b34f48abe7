"""A mock vLLM EngineCore: the engine side of the real wire protocol, for tests, demos and benchmarks.

    python -m pyfront.engine_client.mock_engine --handshake-address tcp://127.0.0.1:62100 --ranks 0 1

It handshakes as an external headless engine (one thread per rank; one process may run several ranks),
registers on every front-end input socket, and serves ADD / ABORT / UTILITY exactly as
docs/engine-protocol.md#mock-engine describes, so vLLM's own front end can serve through it as well as pyfront.

Generation is deterministic: the k-th token of a request is a function of its prompt, its seed and k,
drawn from a list of whole-word token ids (so text reads as words, not as lone UTF-8 bytes). Requests
end on max_tokens (LENGTH), on a configured output length (then the request's EOS token, STOP), or on a
sampled stop token id (STOP, stop_reason = the id). Scripted outputs (utility `mock_script`, or
`--script-file`) replace the generated tokens for the next requests, one token per step: a script is a
list of token ids, or (in `--script-file`, with `--tokenizer`) a text, tokenized as the model would
write it, so a test can have the engine write an exact tool call (Hermes JSON, Qwen3-Coder XML)
token by token.

Front-end block hashing: with `--advertise-feh` the registration carries `native_frontend_hash_config`,
and every ADD's `prompt_block_hashes` is checked against the mock's own recomputation; the counts
(used / missing / mismatched / unexpected) are readable with the utility `mock_stats`. The check runs after the
step that the ADD's arrival triggers, not before it: it is the mock's proof of the front end's hashes, not work a
real FEH engine does (that one uses the hashes it is sent), so it must not sit in the front end's measured latency.

Prefix caching (all opt-in, docs/engine-protocol.md#mock-engine): `--enable-prefix-caching` simulates vLLM's
prefix cache over the feh1 block hashes (`--prefix-cache-blocks N`; `--hash-seed S` gives the engine the
none_hash of PYTHONHASHSEED=S), reports each request's cached prompt tokens in its first output's
prefill_stats, and with `--kv-events-config JSON` (vLLM's flag) publishes vLLM's KV cache events per rank
(engine_client/mock_prefix_cache.py). `--prefill-tokens-per-ms R` holds a request's first token for its
uncached prompt tokens / R ms, one prefill after another per rank, so a request sent to an engine without
its prefix costs every request there time to first token.

Faults: `--die-after-requests N` (then `--die-mode sentinel` sends ENGINE_CORE_DEAD first, `silent`
just exits), and the utilities `mock_die(mode)` and `mock_stall(seconds)`. A process killed and started
again with the same `--ranks` is a restarted engine, as a real one: it says HELLO again and registers again
(docs/engine-protocol.md#engines-that-come-back).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from msgspec import UNSET

from pyfront.engine_client import codec, protocol
from pyfront.engine_client.kv_events import parse_config_flag
from pyfront.engine_client.mock_prefix_cache import (
    KVEventPublisher,
    PrefixCache,
    publishes,
    resolve_kv_events_config,
)
from pyfront.engine_client.negotiation import feh_eligible
from pyfront.engine_client.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReadyResponse,
    EngineCoreRequest,
    EngineHandshakeMessage,
    LogprobsLists,
    LogprobsTensors,
    NativeFrontendHashConfig,
    PrefillStats,
    SchedulerStats,
    UtilityCall,
    UtilityOutput,
    WireTensor,
)
from pyfront.hashing import (
    ALGORITHM,
    HashConfig,
    block_hashes,
    default_none_hash,
    seeded_none_hash,
    unpack_block_hashes,
)
from pyfront.hashing.blocks import hash_chain, salt_extra_keys

logger = logging.getLogger("pyfront.mock_engine")

RECENT_REQUESTS = 64
"""How many received requests each rank keeps (``MockEngineRank.recent``)."""

# Whole-word tokens of the Qwen2/Qwen3 vocabulary (" the", " model", ...): used when no tokenizer is
# given, so the mock's text reads as words with the bundled tokenizer. Any list works for other models.
DEFAULT_WORD_IDS: tuple[int, ...] = (
    279,
    1614,
    323,
    264,
    311,
    315,
    304,
    374,
    429,
    369,
    389,
    448,
    438,
    4285,
    553,
    518,
    1446,
    498,
    504,
    1052,
    646,
    1380,
    892,
    1231,
    3880,
    1083,
    1045,
    3204,
    1156,
    1660,
    1101,
    1008,
    1075,
    1246,
    1614,
    4128,
    1467,
    1882,
    2038,
    1879,
    6236,
    2222,
    3409,
    2115,
    4226,
    3405,
    5486,
    3119,
    1584,
)

KNOWN_UTILITIES_RETURNING_NONE = frozenset(
    {
        "reset_mm_cache", "reset_encoder_cache", "sleep", "release_kv_cache_memory", "pause_scheduler",
        "resume_scheduler", "profile", "save_sharded_state", "execute_dummy_batch", "set_weight_version",
        "collective_rpc", "add_lora", "remove_lora", "pin_lora",
    }
)  # fmt: skip


_INPUT_TYPES = frozenset(
    (
        protocol.REQUEST_TYPE_ADD,
        protocol.REQUEST_TYPE_ABORT,
        protocol.REQUEST_TYPE_UTILITY,
        protocol.REQUEST_TYPE_START_DP_WAVE,
    )
)
"""The type frames a front end may send; the engine-internal sentinels and anything else are refused."""


@dataclass(slots=True)
class MockConfig:
    handshake_address: str
    ranks: Sequence[int] = (0,)
    step_interval_s: float = 0.02
    tokens_per_step: int = 1
    output_len: int | None = None
    """Emit EOS (finish STOP) after this many tokens; None: run to max_tokens."""
    word_ids: Sequence[int] = DEFAULT_WORD_IDS
    max_model_len: int = 32768
    block_size: int = 16
    num_gpu_blocks: int = 8192
    max_num_seqs: int = 1024
    advertise_feh: bool = False
    feh_block_size: int | None = None
    """Block size advertised for FEH; defaults to block_size."""
    feh_none_hash: bytes | None = None
    verify_hashes: bool = True
    die_after_requests: int | None = None
    die_mode: str = "sentinel"
    arrival_log: str | None = None
    vllm_version: str = "0.32.0"
    scripts: Sequence[Sequence[int]] = ()
    """Outputs for the first requests, in arrival order (see the utility mock_script)."""
    step_on_arrival: bool = False
    """Benchmarks: a request arriving at an idle engine is stepped at once, not on the next step tick."""
    enable_prefix_caching: bool = False
    """Simulate vLLM's prefix cache (mock_prefix_cache.PrefixCache): cached tokens in prefill_stats, KV events."""
    prefix_cache_blocks: int | None = None
    """The cache's capacity in blocks; None: num_gpu_blocks."""
    hash_seed: str | None = None
    """The engine's PYTHONHASHSEED: its none_hash (prefix cache and FEH advertisement) is derived from it as vLLM
    does; None: this process's default_none_hash() (or feh_none_hash)."""
    kv_events_config: Mapping[str, Any] | None = None
    """vLLM's ``--kv-events-config`` object (its KVEventsConfig keys; defaults filled in)."""
    kv_events_int_hashes: bool = True
    """vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: block hashes in events as their low 64 bits, else the digests."""
    prefill_tokens_per_ms: float | None = None
    """A request's first token waits for its uncached prompt tokens at this rate, one prefill at a time per rank;
    None: the first token comes on the next step."""


@dataclass(slots=True)
class _Running:
    request: EngineCoreRequest
    output: list[int] = field(default_factory=list)
    script: list[int] | None = None
    seed: int = 0
    prompt_logprobs_sent: bool = False
    cacheable: bool = False
    """The prefix cache is on and the request is a plain token prompt (feh_eligible: no extra keys to model)."""
    digests: list[bytes] = field(default_factory=list)
    """Block hashes of the request's full blocks known so far (prompt, then decode blocks as they fill)."""
    block_ids: list[int] = field(default_factory=list)
    """The cache blocks the request holds: its leading len(block_ids) full blocks are cached."""
    prefill_stats: PrefillStats | None = None
    """Set on admission with the prefix cache on; sent (and cleared) with the first output."""
    prefill_start: float = 0.0
    first_token_at: float = 0.0
    """time.monotonic() from which the first token may be sent (--prefill-tokens-per-ms)."""


@dataclass(slots=True)
class HashCounts:
    used: int = 0
    missing: int = 0
    mismatched: int = 0
    unexpected: int = 0


def _tensor(dtype: str, shape: Sequence[int], fmt: str, values: Sequence[Any]) -> WireTensor:
    return WireTensor(dtype, tuple(shape), struct.pack(f"<{len(values)}{fmt}", *values))


def _skips_reading_cache(request: EngineCoreRequest) -> bool:
    """vLLM's ``skip_reading_prefix_cache``: as sent, else what the engine's ``SamplingParams.__post_init__`` makes
    of it while decoding (prompt logprobs need every prompt position computed)."""
    sp = request.sampling_params
    if sp is None:
        return False
    if sp.skip_reading_prefix_cache is not None:
        return sp.skip_reading_prefix_cache
    return sp.prompt_logprobs is not None or sp.prompt_logprob_token_ids is not None


def _tokens(prompt: Sequence[int], output: list[int], start: int, end: int) -> list[int]:
    """Tokens start..end of prompt + output, without copying the whole sequence."""
    n = len(prompt)
    if end <= n:
        return list(prompt[start:end])
    if start >= n:
        return output[start - n : end - n]
    return [*prompt[start:], *output[: end - n]]


class MockEngineRank:
    """One engine rank: its handshake, sockets and step loop, on its own thread."""

    def __init__(
        self,
        config: MockConfig,
        rank: int,
        ctx: zmq.Context,
        stop: threading.Event,
        kv_events: Mapping[str, Any] | None = None,
    ) -> None:
        """`kv_events` is the resolved ``--kv-events-config`` (resolve_kv_events_config); its publisher binds here."""
        self.config = config
        self.rank = rank
        self.identity = protocol.engine_identity(rank)
        self.ctx = ctx
        self.stop = stop
        self.running: dict[str, _Running] = {}
        self.scripts: list[list[int]] = [list(tokens) for tokens in config.scripts]
        self.hash_counts = HashCounts()
        self.unchecked: deque[EngineCoreRequest] = deque()
        """ADDs whose hashes are not checked yet (check_pending: after the step, or when stats are read)."""
        self._check_lock = threading.Lock()
        self.requests_received = 0
        self.recent: deque[EngineCoreRequest] = deque(maxlen=RECENT_REQUESTS)
        """The last ADDs as received (bounded), for in-process tests that check what the front end sent."""
        self.aborts_received = 0
        self.finished = 0
        self.stall_until = 0.0
        self.inputs: list[zmq.Socket] = []
        self.outputs: list[zmq.Socket] = []
        if config.hash_seed is not None:
            none_hash = seeded_none_hash(config.hash_seed)
        else:
            none_hash = config.feh_none_hash or default_none_hash()
        self.hash_config = HashConfig(ALGORITHM, config.feh_block_size or config.block_size, none_hash)
        """What FEH blobs are checked against (and advertised)."""
        self.cache_hash_config = HashConfig(ALGORITHM, config.block_size, none_hash)
        """The prefix cache's blocks: the engine's block size, the same none_hash."""
        self.publisher = (
            KVEventPublisher(ctx, kv_events, rank) if kv_events is not None and publishes(kv_events) else None
        )
        self.cache = (
            PrefixCache(
                config.prefix_cache_blocks or config.num_gpu_blocks,
                config.block_size,
                events=self.publisher is not None,
                int_hashes=config.kv_events_int_hashes,
            )
            if config.enable_prefix_caching
            else None
        )
        self.prefill_clock = 0.0
        """time.monotonic() when the rank's last queued prefill ends (--prefill-tokens-per-ms)."""
        self.prefill_queue: deque[_Running] = deque()
        """Requests waiting for their first token (--prefill-tokens-per-ms), in admission order, which is
        first_token_at order: prefills run one after another."""
        self._arrivals = open(config.arrival_log, "a", buffering=1) if config.arrival_log else None  # noqa: SIM115

    # ------------------------------------------------------------------ handshake

    def registration(self) -> EngineCoreReadyResponse:
        """What this rank registers with on every input socket: every field a vLLM 0.32 engine sends."""
        cfg = self.config
        return EngineCoreReadyResponse(
            max_model_len=cfg.max_model_len,
            num_gpu_blocks=cfg.num_gpu_blocks,
            block_size=cfg.block_size,
            dp_stats_address=None,
            dtype="bfloat16",
            vllm_version=cfg.vllm_version,
            world_size=1,
            data_parallel_size=1,
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            decode_context_parallel_size=1,
            data_parallel_rank=self.rank,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=8192,
            instance_id=f"pyfront-mock-{os.getpid()}-{self.rank}",
            supports_lora=False,
            max_loras=0,
            mamba_block_size=None,
            kv_cache_size_tokens=cfg.num_gpu_blocks * cfg.block_size,
            kv_cache_max_concurrency=float(cfg.num_gpu_blocks * cfg.block_size) / cfg.max_model_len,
            kv_events_config=None if self.publisher is None else dict(self.publisher.config),
            weight_transfer_backend=None,
            enable_sleep_mode=False,
            supports_draft_weight_updates=False,
            effective_attention_block_size=cfg.block_size,
            native_frontend_hash_config=(
                NativeFrontendHashConfig.from_hash_config(self.hash_config) if cfg.advertise_feh else UNSET
            ),
        )

    def handshake(self) -> None:
        """HELLO, INIT, registration on every input socket, READY: what a headless vLLM engine does."""
        hs = self.ctx.socket(zmq.DEALER)
        hs.setsockopt(zmq.IDENTITY, self.identity)
        hs.setsockopt(zmq.LINGER, 5000)
        hs.connect(self.config.handshake_address)
        hs.send(codec.encode_handshake(EngineHandshakeMessage.hello()))
        while not hs.poll(100):
            if self.stop.is_set():
                hs.close(0)
                return
        addresses = codec.decode_init(hs.recv()).addresses
        registration = codec.encode_ready_response(self.registration())
        for input_address, output_address in zip(addresses.inputs, addresses.outputs, strict=True):
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self.identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(input_address)
            sock.send(registration)
            self.inputs.append(sock)
            push = self.ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 4000)
            push.setsockopt(zmq.SNDHWM, 0)
            push.connect(output_address)
            self.outputs.append(push)
        hs.send(codec.encode_handshake(EngineHandshakeMessage.ready()))
        hs.close()
        logger.info("rank %d admitted by %d front-end process(es)", self.rank, len(self.inputs))

    # ------------------------------------------------------------------ inputs

    def handle_input(self, frames: list[bytes], received: float | None = None) -> None:
        """Decode one input message with the protocol's codec and act on it. ``received``: the wall time its frames
        were read off the socket, which the arrival log records (default: now).

        A malformed payload raises out of the rank's loop and ends it, as a real engine's input thread dies
        (docs/engine-protocol.md#inputs-that-break-an-engine); an unknown type byte is only logged, so a test
        sees the mistake without losing the rank.
        """
        if bytes(frames[0]) not in _INPUT_TYPES:
            logger.error("rank %d: unknown request type %r", self.rank, bytes(frames[0]))
            return
        kind, message = codec.decode_input(frames)
        if isinstance(message, EngineCoreRequest):
            self.handle_add(message, received)
        elif isinstance(message, UtilityCall):
            self.handle_utility(message.client_index, message.call_id, message.method_name, message.args)
        elif kind == protocol.REQUEST_TYPE_ABORT:
            assert isinstance(message, list)
            for request_id in message:
                self.aborts_received += 1
                state = self.running.pop(request_id, None)
                if state is not None:
                    self.release(state)
        # START_DP_WAVE: a dense engine has nothing to do.

    def handle_add(self, request: EngineCoreRequest, received: float | None = None) -> None:
        if self._arrivals is not None:
            # The time the frames came off the socket, not this moment: decoding a 100k-id ADD takes the mock
            # 3-4 ms (msgspec, ~34 ns an id), which is the engine's cost, not the front end's that benchmarks
            # time with this log.
            at = time.time() if received is None else received
            self._arrivals.write(f"{at:.6f} {self.rank} {request.request_id}\n")
        if request.request_id in self.running:
            logger.error("rank %d: duplicate request id %s: a real engine dies here", self.rank, request.request_id)
            self.die("sentinel")
        self.requests_received += 1
        self.recent.append(request)
        self.unchecked.append(request)
        sp = request.sampling_params
        seed_source = f"{len(request.prompt_token_ids or ())}:{sum(request.prompt_token_ids or ())}"
        if sp is not None and sp.seed is not None:
            seed_source += f":{sp.seed}"
        seed = int.from_bytes(hashlib.blake2b(seed_source.encode(), digest_size=4).digest(), "little")
        script = self.scripts.pop(0) if self.scripts else None
        state = _Running(request, script=script, seed=seed)
        self.running[request.request_id] = state
        self.admit(state)
        limit = self.config.die_after_requests
        if limit is not None and self.requests_received >= limit:
            self.die(self.config.die_mode)

    def admit(self, state: _Running) -> None:
        """A new request's prefix-cache lookup and store, its prefill_stats, and its place on the prefill clock.

        As in vLLM: the hit is the longest run of leading prompt blocks in the cache, at most
        (len(prompt) - 1) // block_size blocks (the last prompt token is always recomputed, for its logits);
        the prompt's other full blocks are stored at once (vLLM caches blocks when it schedules their
        computation); a request that skips reading the cache (prompt logprobs) still stores its blocks.
        """
        request = state.request
        prompt = request.prompt_token_ids or []
        cached = 0
        if self.cache is not None:
            state.cacheable = feh_eligible(request)
            if state.cacheable:
                block = self.config.block_size
                state.digests = self.prompt_digests(request)
                hit = (
                    []
                    if _skips_reading_cache(request)
                    else self.cache.lookup(state.digests, max(0, len(prompt) - 1) // block, len(prompt))
                )
                first = len(hit)
                cached = first * block
                new = self.cache.store(
                    state.digests[first:],
                    prompt[cached : len(state.digests) * block],
                    first,
                    state.digests[first - 1] if first else None,
                    request.cache_salt,
                    request.session_id,
                )
                state.block_ids = hit + new
            state.prefill_stats = PrefillStats(
                num_prompt_tokens=len(prompt),
                num_computed_tokens=len(prompt) - cached,
                num_cached_tokens=cached,
                num_local_cached_tokens=cached,
            )
        rate = self.config.prefill_tokens_per_ms
        if rate:
            state.prefill_start = max(time.monotonic(), self.prefill_clock)
            state.first_token_at = self.prefill_clock = state.prefill_start + (len(prompt) - cached) / rate / 1000
            self.prefill_queue.append(state)

    def prompt_digests(self, request: EngineCoreRequest) -> list[bytes]:
        """The prompt's block hashes for the prefix cache.

        The front end's FEH blob when it fits the cache's block size (an FEH engine uses the hashes it is sent,
        right or wrong: a test sees what a wrong blob does), else the feh1 recipe with the engine's none_hash.
        """
        prompt = request.prompt_token_ids or []
        if request.prompt_block_hashes is not None:
            with contextlib.suppress(ValueError):
                return unpack_block_hashes(request.prompt_block_hashes, self.config.block_size, len(prompt))
        return block_hashes(prompt, self.cache_hash_config, request.cache_salt)

    def cache_decoded(self, state: _Running) -> None:
        """Store the full blocks that this step completed in the KV cache.

        vLLM caches a block once the KV of its last token is computed: the newest sampled token's KV is
        computed by the next step, so it is left out (and the final token of a request is never cached).
        """
        if self.cache is None or not state.cacheable:
            return
        block = self.config.block_size
        prompt = state.request.prompt_token_ids or []
        full = (len(prompt) + len(state.output) - 1) // block
        stored = len(state.block_ids)
        if full <= stored:
            return
        known = len(state.digests)
        if full > known:
            state.digests += hash_chain(
                tuple(_tokens(prompt, state.output, known * block, full * block)),
                block,
                state.digests[-1] if known else self.cache_hash_config.none_hash,
                None if known else salt_extra_keys(state.request.cache_salt),
            )
        state.block_ids += self.cache.store(
            state.digests[stored:full],
            _tokens(prompt, state.output, stored * block, full * block),
            stored,
            state.digests[stored - 1] if stored else None,
            state.request.cache_salt,
            state.request.session_id,
        )

    def release(self, state: _Running) -> None:
        """A request ended (finished or aborted): its cache blocks become evictable."""
        if self.cache is not None and state.block_ids:
            self.cache.release(state.block_ids)
            state.block_ids = []

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        """vLLM's ``reset_prefix_cache(reset_running_requests)``: False while requests hold KV blocks.

        With `reset_running_requests` vLLM preempts them first; here they keep running and cache their blocks
        again from block 0 on their next step, as their recomputation would. The AllBlocksCleared event goes out
        with the next step's batch, as in vLLM (whose engine only steps while it has requests).
        """
        if self.cache is None:
            return True
        if self.running and not reset_running_requests:
            logger.warning("rank %d: prefix cache not reset: %d requests hold blocks", self.rank, len(self.running))
            return False
        for state in self.running.values():
            state.block_ids = []
        self.cache.reset()
        return True

    def publish_events(self) -> None:
        """One EventBatch for the step's cache events, if it had any."""
        if self.publisher is not None and self.cache is not None:
            events = self.cache.take_events()
            if events:
                self.publisher.publish(events, time.time())

    def check_pending(self) -> None:
        """Check the hashes of every ADD received so far (the rank's thread after a step, or a stats reader's)."""
        with self._check_lock:
            while self.unchecked:
                self.check_hashes(self.unchecked.popleft())

    def check_hashes(self, request: EngineCoreRequest) -> None:
        blob = request.prompt_block_hashes
        prompt = request.prompt_token_ids or []
        if not self.config.advertise_feh:
            if blob is not None:
                self.hash_counts.unexpected += 1
            return
        block = self.hash_config.block_size
        eligible = feh_eligible(request)
        if blob is None:
            if eligible and len(prompt) >= block:
                self.hash_counts.missing += 1
            return
        if not self.config.verify_hashes:
            self.hash_counts.used += 1
            return
        try:
            received = unpack_block_hashes(blob, block, len(prompt))
        except ValueError as exc:
            logger.warning("rank %d: bad prompt_block_hashes for %s: %s", self.rank, request.request_id, exc)
            self.hash_counts.mismatched += 1
            return
        if received == block_hashes(prompt, self.hash_config, request.cache_salt):
            self.hash_counts.used += 1
        else:
            logger.warning("rank %d: prompt_block_hashes of %s differ from the recipe", self.rank, request.request_id)
            self.hash_counts.mismatched += 1

    def stats(self) -> dict[str, Any]:
        self.check_pending()
        return {
            "rank": self.rank,
            "requests": self.requests_received,
            "aborts": self.aborts_received,
            "finished": self.finished,
            "running": len(self.running),
            "hashes_used": self.hash_counts.used,
            "hashes_missing": self.hash_counts.missing,
            "hashes_mismatched": self.hash_counts.mismatched,
            "hashes_unexpected": self.hash_counts.unexpected,
            "feh_advertised": self.config.advertise_feh,
            **self.cache_stats(),
        }

    def cache_stats(self) -> dict[str, Any]:
        """The prefix cache's counters (zeros without --enable-prefix-caching)."""
        counters = self.cache.counters if self.cache is not None else None
        return {
            "prefix_caching": self.cache is not None,
            "cache_queried_tokens": counters.queried_tokens if counters else 0,
            "cache_hit_tokens": counters.hit_tokens if counters else 0,
            "cache_blocks_stored": counters.blocks_stored if counters else 0,
            "cache_blocks_evicted": counters.blocks_evicted if counters else 0,
            "cache_blocks": len(self.cache) if self.cache is not None else 0,
            "kv_event_batches": self.publisher.published if self.publisher is not None else 0,
        }

    def handle_utility(self, client_index: int, call_id: int, method: str, args: list[Any]) -> None:
        result: Any = None
        failure: str | None = None
        if method == "is_sleeping" or method == "is_scheduler_paused":
            result = False
        elif method == "get_supported_tasks":
            result = ["generate"]
        elif method == "reset_prefix_cache":
            result = self.reset_prefix_cache(bool(args[0]) if args else False)
        elif method == "wake_up":
            result = True
        elif method == "list_loras":
            result = []
        elif method == "mock_stats":
            result = self.stats()
        elif method == "mock_script":
            self.scripts.extend([list(map(int, tokens)) for tokens in args[0]])
        elif method == "mock_stall":
            self.stall_until = time.monotonic() + float(args[0])
        elif method == "mock_die":
            self.die(args[0] if args else "sentinel")
        elif method in KNOWN_UTILITIES_RETURNING_NONE:
            result = None
        else:
            failure = f"Call to {method} method failed: 'EngineCore' object has no attribute '{method}'"
        reply = UtilityOutput(call_id, failure, None) if failure else UtilityOutput.success(call_id, result)
        self.send(
            client_index,
            EngineCoreOutputs(engine_index=self.rank, utility_output=reply, timestamp=time.monotonic()),
        )

    def die(self, mode: str) -> None:
        logger.error("rank %d dies (%s)", self.rank, mode)
        if mode == "sentinel":
            for push in self.outputs:
                push.send(protocol.ENGINE_CORE_DEAD)
            time.sleep(0.2)  # let the sentinel leave before the process goes
        os._exit(1)

    # ------------------------------------------------------------------ outputs

    def send(self, client_index: int, outputs: EngineCoreOutputs) -> None:
        if 0 <= client_index < len(self.outputs):
            self.outputs[client_index].send_multipart(codec.encode_outputs(outputs), copy=False)

    def next_token(self, state: _Running, position: int) -> int:
        if state.script is not None:
            return state.script[position]
        words = self.config.word_ids
        return words[(state.seed + position * 7919) % len(words)]

    def step(self, decode: bool = True) -> None:
        """One engine step: tokens for every running request whose first token is due.

        `decode=False` only sends due first tokens: a prefill that ends between two step ticks
        (--prefill-tokens-per-ms) gets its token then, while decoding requests keep the tick's pace.
        """
        by_client: dict[int, list[EngineCoreOutput]] = {}
        done: list[str] = []
        cfg = self.config
        began = time.monotonic()
        for request_id, state in self.running.items():
            if state.first_token_at > began or (state.output and not decode):
                continue
            request = state.request
            sp = request.sampling_params
            assert sp is not None
            max_tokens = sp.max_tokens or 16
            stop_ids = set(sp.stop_token_ids or ())
            new: list[int] = []
            finish: int | None = None
            stop_reason: int | str | None = None
            for _ in range(cfg.tokens_per_step):
                position = len(state.output)
                limit = len(state.script) if state.script is not None else cfg.output_len
                if limit is not None and position >= limit and not sp.ignore_eos and sp.eos_token_id is not None:
                    token = sp.eos_token_id
                    finish = protocol.FinishReason.STOP
                else:
                    token = (
                        self.next_token(state, position)
                        if limit is None or position < limit
                        else (
                            self.next_token(state, position % max(limit, 1))
                            if limit
                            else self.next_token(state, position)
                        )
                    )
                state.output.append(token)
                new.append(token)
                if finish is None and token in stop_ids and len(state.output) > sp.min_tokens:
                    finish, stop_reason = protocol.FinishReason.STOP, token
                if finish is None and len(state.output) >= max_tokens:
                    finish = protocol.FinishReason.LENGTH
                if finish is not None:
                    break
            self.cache_decoded(state)
            output = EngineCoreOutput(request_id, new, finish_reason=finish, stop_reason=stop_reason)
            if state.prefill_stats is not None:
                output.prefill_stats, state.prefill_stats = self.finalize_prefill_stats(state), None
            if sp.logprobs is not None:
                output.new_logprobs = self.sample_logprobs(new, sp.logprobs, len(state.output) - len(new))
            if sp.prompt_logprobs is not None and not state.prompt_logprobs_sent:
                state.prompt_logprobs_sent = True
                output.new_prompt_logprobs_tensors = self.prompt_logprobs(
                    request.prompt_token_ids or [], sp.prompt_logprobs
                )
            by_client.setdefault(request.client_index, []).append(output)
            if finish is not None:
                done.append(request_id)
        for request_id in done:
            self.release(self.running.pop(request_id))
        self.finished += len(done)
        # With a prefill clock, requests whose prefill has not started are the scheduler's waiting ones.
        waiting = sum(s.prefill_start > began for s in self.running.values()) if cfg.prefill_tokens_per_ms else 0
        stats = SchedulerStats(
            num_running_reqs=len(self.running) - waiting,
            num_waiting_reqs=waiting,
            kv_cache_usage=min(1.0, len(self.running) / max(1, cfg.max_num_seqs)),
        )
        self.publish_events()  # before the outputs go, as vLLM publishes in update_from_output
        now = time.monotonic()
        for client_index, outputs in by_client.items():
            self.send(client_index, EngineCoreOutputs(self.rank, outputs, stats, now))

    def finalize_prefill_stats(self, state: _Running) -> PrefillStats:
        """vLLM's ``PrefillStats.finalize``, at the first output: the prompt tokens this request wrote to the cache.

        vLLM passes the request's cached tokens (its blocks' largest hashed length), here the blocks it holds.
        """
        stats = state.prefill_stats
        assert stats is not None
        held = len(state.block_ids) * self.config.block_size
        stats.num_cache_creation_tokens = max(0, min(held, stats.num_prompt_tokens) - stats.num_cached_tokens)
        return stats

    def next_first_token(self) -> float | None:
        """When the earliest waiting first token is due; entries of requests that ended or started are dropped."""
        queue = self.prefill_queue
        while queue:
            state = queue[0]
            if not state.output and self.running.get(state.request.request_id) is state:
                return state.first_token_at
            queue.popleft()
        return None

    def _top(self, token: int, k: int) -> list[int]:
        words = self.config.word_ids
        start = token % len(words)
        return [words[(start + j + 1) % len(words)] for j in range(k)]

    def sample_logprobs(self, tokens: list[int], k: int, start: int) -> LogprobsLists:
        k = 5 if k < 0 else k
        ids: list[int] = []
        values: list[float] = []
        ranks: list[int] = []
        for offset, token in enumerate(tokens):
            position = start + offset
            top = self._top(token, k)
            ids += [token, *top]
            values += [-0.25 - 0.01 * (position % 10), *(-0.5 - 0.5 * j for j in range(k))]
            ranks.append(1 + position % 3)
        rows = len(tokens)
        return LogprobsLists(
            _tensor("<i4", (rows, k + 1), "i", ids),
            _tensor("<f4", (rows, k + 1), "f", values),
            _tensor("<i8", (rows,), "q", ranks),
        )

    def prompt_logprobs(self, prompt: list[int], k: int) -> LogprobsTensors:
        k = 5 if k < 0 else k
        rows = max(0, len(prompt) - 1)
        ids: list[int] = []
        values: list[float] = []
        for i in range(rows):
            token = prompt[i + 1]
            ids += [token, *self._top(token, k)]
            values += [-1.0 - 0.001 * i, *(-0.5 - 0.5 * j for j in range(k))]
        return LogprobsTensors(
            _tensor("int32", (rows, k + 1), "i", ids),
            _tensor("float32", (rows, k + 1), "f", values),
            _tensor("int32", (rows,), "i", [1 + i % 4 for i in range(rows)]),
        )

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        try:
            self.handshake()
            if self.inputs:
                self.serve()
        finally:
            for sock in self.inputs + self.outputs:
                sock.close(0)
            if self.publisher is not None:
                self.publisher.shutdown()

    def serve(self) -> None:
        """The step loop: inputs as they come, a step every step interval while requests run."""
        poller = zmq.Poller()
        for sock in self.inputs:
            poller.register(sock, zmq.POLLIN)
        interval = self.config.step_interval_s
        next_step = time.monotonic() + interval
        while not self.stop.is_set():
            now = time.monotonic()
            if now < self.stall_until:
                time.sleep(min(0.05, self.stall_until - now))
                next_step = time.monotonic() + interval
                continue
            timeout_ms = int(max(0.0, (next_step - now) * 1000)) if self.running else 100  # as Poller.poll truncates
            due = self.next_first_token()
            if due is not None:
                timeout_ms = min(timeout_ms, int(max(0.0, (due - now) * 1000)))
            was_idle = not self.running
            for sock, _ in poller.poll(timeout_ms):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.handle_input(frames, time.time())
            now = time.monotonic()
            if not self.running:
                next_step = now + interval
            elif was_idle and self.config.step_on_arrival:
                self.step()
                next_step = now + interval
            elif now >= next_step:
                self.step()
                next_step = max(next_step + interval, now)
            elif (due := self.next_first_token()) is not None and due <= now:
                self.step(decode=False)
            if self.unchecked:
                self.check_pending()


class MockEngine:
    """Every configured rank on its own thread; `start()`, then `stop()` (or run until killed)."""

    def __init__(self, config: MockConfig) -> None:
        kv_events = _kv_events(config)  # a bad config fails before any socket exists
        self.stop_event = threading.Event()
        self.ctx = zmq.Context()
        self.ranks: list[MockEngineRank] = []
        try:
            for rank in config.ranks:
                self.ranks.append(MockEngineRank(config, rank, self.ctx, self.stop_event, kv_events))
        except BaseException:  # a KV events port in use: close what the earlier ranks opened
            self._shutdown_publishers()
            self.ctx.term()
            raise
        self.threads = [threading.Thread(target=r.run, name=f"mock-rank-{r.rank}", daemon=True) for r in self.ranks]

    def start(self) -> MockEngine:
        for thread in self.threads:
            thread.start()
        return self

    def stats(self) -> list[dict[str, Any]]:
        return [rank.stats() for rank in self.ranks]

    def script(self, *token_lists: Sequence[int]) -> None:
        """The next requests (one list each, in arrival order on each rank) emit exactly these tokens."""
        for rank in self.ranks:
            rank.scripts.extend(list(tokens) for tokens in token_lists)

    def join(self) -> None:
        for thread in self.threads:
            while thread.is_alive():
                thread.join(0.2)

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(5)
        self._shutdown_publishers()  # the ranks' threads do it too; not if they never ran
        self.ctx.term()

    def _shutdown_publishers(self) -> None:
        for rank in self.ranks:
            if rank.publisher is not None:
                rank.publisher.shutdown()


def _kv_events(config: MockConfig) -> dict[str, Any] | None:
    """The resolved ``kv_events_config``, with the warnings vLLM's VllmConfig gives for odd combinations."""
    if config.kv_events_config is None:
        return None
    resolved = resolve_kv_events_config(config.kv_events_config)
    if resolved["enable_kv_cache_events"] and not config.enable_prefix_caching:
        logger.warning(
            "KV cache events are on, but prefix caching is not enabled. Use --enable-prefix-caching to enable."
        )
    if resolved["publisher"] != "null" and not resolved["enable_kv_cache_events"]:
        logger.warning(
            "KV cache events are disabled, but the scheduler is configured to publish them. "
            "Modify KVEventsConfig.enable_kv_cache_events to True to enable."
        )
    return resolved


def run_mock_engine(config: MockConfig, stop: threading.Event | None = None) -> None:
    """Run every configured rank until `stop` is set or the process is killed."""
    engine = MockEngine(config)
    if stop is not None:
        engine.stop_event = stop
        for rank in engine.ranks:
            rank.stop = stop
    engine.start()
    try:
        engine.join()
    finally:
        engine.stop()


def _load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer (the bundled names resolved), imported only when asked (slow)."""
    from transformers import AutoTokenizer

    from pyfront.server.text.bundled_tokenizer import resolve_tokenizer_name

    return AutoTokenizer.from_pretrained(resolve_tokenizer_name(name))


def load_scripts(entries: Sequence[Any], tokenizer_name: str | None) -> list[list[int]]:
    """`--script-file` entries as token lists: a list of ids as is, a text tokenized with `tokenizer_name`.

    A text must come back unchanged from its tokens (a script that decodes differently would test
    something else than it says): ValueError otherwise, and for a text without a tokenizer.
    """
    tokenizer = None
    out: list[list[int]] = []
    for entry in entries:
        if not isinstance(entry, str):
            out.append([int(t) for t in entry])
            continue
        if tokenizer_name is None:
            raise ValueError("a text script needs --tokenizer")
        if tokenizer is None:
            tokenizer = _load_tokenizer(tokenizer_name)
        ids = tokenizer.encode(entry, add_special_tokens=False)
        if tokenizer.decode(ids) != entry:
            raise ValueError(f"script text does not round-trip through the tokenizer: {entry[:60]!r}")
        out.append(ids)
    return out


def load_word_ids(tokenizer_path: str) -> list[int]:
    """Whole-word token ids of a tokenizer (a directory or a bundled tokenizer's name)."""
    from pyfront.server.text.bundled_tokenizer import whole_word_token_ids

    return whole_word_token_ids(_load_tokenizer(tokenizer_path), 512)


def parse_args(argv: Sequence[str] | None = None) -> MockConfig:
    p = argparse.ArgumentParser(
        prog="python -m pyfront.engine_client.mock_engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--handshake-address", required=True, help="front end's handshake ROUTER, tcp://HOST:PORT")
    p.add_argument("--ranks", type=int, nargs="+", default=[0], help="global DP ranks this process serves")
    p.add_argument("--step-interval", type=float, default=0.02, help="seconds per engine step")
    p.add_argument("--tokens-per-step", type=int, default=1)
    p.add_argument("--output-len", type=int, default=None, help="emit EOS after this many tokens")
    p.add_argument("--tokenizer", default=None, help="emit whole-word tokens of this tokenizer")
    p.add_argument("--word-ids", default=None, help="comma-separated token ids to emit")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=1024)
    p.add_argument("--advertise-feh", action="store_true", help="advertise native_frontend_hash_config")
    p.add_argument("--feh-block-size", type=int, default=None)
    p.add_argument("--feh-none-hash", default=None, help="hex; default: the recipe's default none_hash")
    p.add_argument("--no-verify-hashes", action="store_true", help="count hashes without recomputing them")
    p.add_argument("--die-after-requests", type=int, default=None)
    p.add_argument("--die-mode", choices=("sentinel", "silent"), default="sentinel")
    p.add_argument("--arrival-log", default=None, help="append 'wall_time rank request_id' per ADD")
    p.add_argument(
        "--script-file",
        default=None,
        help="JSON list of the first requests' outputs: token-id lists, or texts (tokenized with --tokenizer)",
    )
    p.add_argument(
        "--step-on-arrival",
        action="store_true",
        help="benchmarks: step at once when a request reaches an idle engine (default: on the step tick)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="simulate vLLM's prefix cache: cached tokens in prefill_stats, KV cache events with --kv-events-config",
    )
    p.add_argument("--prefix-cache-blocks", type=int, default=None, help="cache capacity in blocks (default 8192)")
    p.add_argument(
        "--hash-seed",
        default=None,
        help="the engine's PYTHONHASHSEED: none_hash = sha256(pickle(seed)) for the cache and the FEH advertisement",
    )
    p.add_argument(
        "--kv-events-config",
        default=None,
        help='vLLM\'s flag, e.g. \'{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557"}\' (endpoints + rank)',
    )
    p.add_argument(
        "--prefill-tokens-per-ms",
        type=float,
        default=None,
        help="first token after uncached prompt tokens / RATE ms, one prefill at a time per rank",
    )
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    if a.hash_seed is not None and a.feh_none_hash:
        p.error("--hash-seed and --feh-none-hash both set the none_hash: give one")
    kv_events = None
    if a.kv_events_config is not None:
        try:
            kv_events = parse_config_flag(a.kv_events_config)
            resolve_kv_events_config(kv_events)
        except ValueError as exc:
            p.error(str(exc))
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s mock-engine %(levelname)s %(message)s")
    if a.word_ids:
        words: Sequence[int] = [int(x) for x in a.word_ids.split(",")]
    elif a.tokenizer:
        words = load_word_ids(a.tokenizer)
    else:
        words = DEFAULT_WORD_IDS
    none_hash = bytes.fromhex(a.feh_none_hash) if a.feh_none_hash else None
    return MockConfig(
        handshake_address=a.handshake_address, ranks=a.ranks, step_interval_s=a.step_interval,
        tokens_per_step=a.tokens_per_step, output_len=a.output_len, word_ids=words,
        max_model_len=a.max_model_len, block_size=a.block_size, max_num_seqs=a.max_num_seqs,
        advertise_feh=a.advertise_feh, feh_block_size=a.feh_block_size, feh_none_hash=none_hash,
        verify_hashes=not a.no_verify_hashes, die_after_requests=a.die_after_requests, die_mode=a.die_mode,
        arrival_log=a.arrival_log, step_on_arrival=a.step_on_arrival,
        enable_prefix_caching=a.enable_prefix_caching, prefix_cache_blocks=a.prefix_cache_blocks,
        hash_seed=a.hash_seed, kv_events_config=kv_events, prefill_tokens_per_ms=a.prefill_tokens_per_ms,
        kv_events_int_hashes=bool(int(os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1"))),
        scripts=load_scripts(json.loads(Path(a.script_file).read_text()), a.tokenizer) if a.script_file else (),
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    if config.feh_none_hash is None and config.advertise_feh:
        config.feh_none_hash = default_none_hash()
    run_mock_engine(config)


if __name__ == "__main__":
    main(sys.argv[1:])
