"""The front end's client of one or many EngineCore processes over ZMQ.

Layering: `handshake` admits the engines; this module owns the per-process input ROUTER and output
PULL, sends ADD / ABORT / UTILITY, routes each decoded output batch once to per-request streams, and
watches engine health. It knows nothing of HTTP, tokenizers or text.

Health, since the protocol has no heartbeat (docs/engine-protocol.md#health-and-death):
- `ENGINE_CORE_DEAD` on the output socket (which engine sent it is not said) and every engine
  connection to the input ROUTER that drops trigger an immediate probe of every engine;
- a send to an engine whose process is gone fails at once (`EngineUnreachable`: the input ROUTER
  routes only to connected identities): that engine is dead;
- engines that sent nothing for `ping_interval_s` get a utility ping; no answer within
  `stall_timeout_s` marks them stalled. Either way their in-flight requests fail with
  `EngineDeadError` (a 5xx for the server); a stalled engine also gets ABORTs for them, and comes back
  to service if it answers a later ping.

Engines that come back (docs/engine-protocol.md#engines-that-come-back): a dead engine process that is started
again repeats the handshake (the handshake socket stays open: `HandshakeServer.serve_restarts`, here or in
the parent of several API servers) and registers again on this process's input ROUTER, which is read for
the life of the client. A new registration for a known rank is a restart, whatever state the rank was in:
the rank gets a fresh `EngineState`, its stale in-flight requests fail with `EngineDeadError` (the new
process never heard of them), FEH is negotiated again over the current registrations (it only ever turns
off, for every engine, if the new one's config differs), and the balancer routes to it again. `health()`
names the ranks out of service meanwhile (`degraded_ranks`). A registration from a rank outside
0..data_parallel_size-1 is ignored: the size is fixed at start-up.

The sockets themselves are `transport`'s: ZMTP on the event loop, or libzmq. Either routes outputs in bounded
batches (`OUTPUT_BATCH_MESSAGES` or `OUTPUT_BATCH_SECONDS`, whichever comes first) and then yields to the event
loop, however fast the engines send: HTTP, client disconnects and signals must get in even when the front end
falls behind the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import itertools
import logging
import os
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import zmq
import zmq.asyncio

from pyfront.engine_client import codec
from pyfront.engine_client.handshake import (
    ClientAddresses,
    HandshakeError,
    HandshakeServer,
    handshake_address,
    identity_rank,
)
from pyfront.engine_client.io_threads import batch_io_threads
from pyfront.engine_client.kv_events import KVEventsEndpoints, resolve_endpoints
from pyfront.engine_client.kv_subscriber import KVEventSubscriber, initial_mode
from pyfront.engine_client.negotiation import Negotiation, feh_eligible, feh_enabled_by_env, negotiate
from pyfront.engine_client.prefix_index import APPROXIMATE, EVENT_MODES, PrefixIndex, prompt_keys
from pyfront.engine_client.protocol import (
    EngineCoreOutput,
    EngineCoreReadyResponse,
    EngineCoreRequest,
    engine_identity,
)
from pyfront.engine_client.routing import EngineRouting, Prediction, Router, RoutingConfig, RoutingReport, RoutingStats
from pyfront.engine_client.transport import EngineSockets, EngineUnreachable, open_engine_sockets
from pyfront.engine_client.validation import validate_request
from pyfront.hashing import HashConfig, PromptHasher

logger = logging.getLogger(__name__)

PING_METHOD = "is_sleeping"

INLINE_LOOKUP_BLOCKS = 512
"""Prompts of more blocks are looked up in the prefix index on a worker thread (the walk grows with the prompt)."""
INLINE_ENCODE_TOKENS = 16384
"""ADDs of longer prompts are encoded on a worker thread: msgspec writes every id (~4.5 ns each here, 0.45-0.67 ms
at 100k ids in a server), which grows with the history; at this bound the encode costs about a thread hop."""


class EngineError(RuntimeError):
    """Base of the errors a request can end with because of its engine."""


class EngineDeadError(EngineError):
    """The engine serving this request died or stalled; the request is gone."""


class EngineUnavailableError(EngineError):
    """No healthy engine can take the request (the server answers 503)."""


class RequestAbortedError(EngineError):
    """The request was aborted by this front end; its stream ends here."""


class DuplicateRequestError(ValueError):
    """The request id is already in flight (sending it would kill the engine)."""


@dataclass(slots=True)
class EngineClientConfig:
    data_parallel_address: str = "127.0.0.1"
    data_parallel_rpc_port: int = 62100
    data_parallel_size: int = 1
    client_index: int = 0
    client_count: int = 1
    run_handshake: bool = True
    """False when another process runs the handshake for this one (several API servers)."""
    input_address: str | None = None
    output_address: str | None = None
    transport: str | None = None
    """auto, zmtp or libzmq (engine_client/transport); None: read PYFRONT_ENGINE_TRANSPORT."""
    startup_timeout_s: float = 600.0
    ping_interval_s: float = 2.0
    stall_timeout_s: float = 30.0
    utility_timeout_s: float = 60.0
    feh_enabled: bool | None = None
    """None: read VLLM_NATIVE_FEH."""
    hash_threads: int = 2
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    kv_events_config: dict[str, Any] | None = None
    """vLLM's ``--kv-events-config`` value (offset per rank here); None: each engine's registration says."""
    kv_events_hosts: Sequence[str] = ()
    """Where engines that bind a wildcard endpoint are reached (one host, or one per rank); default 127.0.0.1."""


@dataclass(slots=True, eq=False)
class EngineState:
    """What this front end knows of one engine."""

    rank: int
    identity: bytes
    registration: EngineCoreReadyResponse
    healthy: bool = True
    connected: bool = True
    status: str = "ok"
    in_flight: set[str] = field(default_factory=set)
    num_waiting: int = 0
    num_running: int = 0
    kv_cache_usage: float = 0.0
    last_seen: float = field(default_factory=time.monotonic)
    requests_sent: int = 0
    restarts: int = 0
    """How many times this rank registered again after start-up."""

    @property
    def num_in_flight(self) -> int:
        return len(self.in_flight)


class StreamListener(Protocol):
    """Receives a RequestStream's outputs as they are routed (see RequestStream.listen); must not raise."""

    def on_output(self, output: EngineCoreOutput) -> None: ...

    def on_error(self, error: BaseException) -> None: ...


class RequestStream:
    """The outputs of one engine request, in order; iterate with `async for` or call `get()`.

    The output loop pushes without awaiting; the consumer wakes once per batch of outputs, so a
    consumer that falls behind drains several outputs in one go (`drain()`).
    """

    __slots__ = ("_buffer", "_error", "_listener", "_waiter", "finished", "prediction", "rank", "request_id")

    def __init__(self, request_id: str, rank: int) -> None:
        self.request_id = request_id
        self.rank = rank
        self.finished = False
        self.prediction: Prediction | None = None
        """What routing expected of the first output (checked against the engine's num_cached_tokens, then None)."""
        self._buffer: deque[EngineCoreOutput] = deque()
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._listener: StreamListener | None = None

    def listen(self, listener: StreamListener | None) -> list[EngineCoreOutput]:
        """Hand every later output (and the error, if any) straight to `listener`, from the output loop.

        Returns the outputs received so far (the listener takes them first, then checks `error`);
        `listen(None)` goes back to buffering. A listener saves a task switch per output: it runs
        inside the batch's routing.
        """
        self._listener = listener
        outputs = list(self._buffer)
        self._buffer.clear()
        return outputs

    @property
    def error(self) -> BaseException | None:
        """Why the stream failed (engine dead, aborted, ...), or None."""
        return self._error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def push(self, output: EngineCoreOutput) -> None:
        """Deliver one output: to the listener at once, else into the buffer (waking a waiting consumer).

        The producer's side of the stream: `EngineClient`'s output loop calls it for every routed output,
        and an in-process engine (tests' FakeEngine) feeds streams the same way, so consumers cannot tell
        them apart. Never blocks and never awaits.
        """
        listener = self._listener
        if listener is not None:
            listener.on_output(output)
            return
        self._buffer.append(output)
        self._wake()

    def fail(self, error: BaseException, *, finished: bool = False) -> None:
        """End the stream with `error` (the first error wins); outputs already buffered are still delivered.

        `finished=True` is an abort by this front end: `async for` then stops quietly after the buffered
        outputs, while `get()` / `drain()` raise `error`, so callers waiting on one output learn why.
        """
        if finished:
            self.finished = True
        if self._error is None:
            self._error = error
            if self._listener is not None:
                self._listener.on_error(error)
        self._wake()

    async def _wait(self) -> None:
        while not self._buffer:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def get(self) -> EngineCoreOutput:
        await self._wait()
        return self._buffer.popleft()

    async def drain(self, timeout: float | None = None) -> list[EngineCoreOutput]:
        """Every output received so far, oldest first: at least one, or none if `timeout` seconds pass first.

        The timeout is a timer on the waiter, not a cancellation, so it costs a call_later and loses
        nothing: the server uses it for SSE keep-alives and request deadlines.
        """
        if timeout is None:
            await self._wait()
        elif not self._buffer:
            if self._error is not None:
                raise self._error
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout, release_waiter, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                timer.cancel()
            if not self._buffer and self._error is not None:
                raise self._error
        outputs = list(self._buffer)
        self._buffer.clear()
        return outputs

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> EngineCoreOutput:
        if self.finished and not self._buffer:
            raise StopAsyncIteration
        output = await self.get()
        if output.finish_reason is not None:
            self.finished = True
        return output


def release_waiter(waiter: asyncio.Future[None]) -> None:
    """Wake whoever awaits `waiter` (a timer or callback may fire after it was already woken)."""
    if not waiter.done():
        waiter.set_result(None)


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class EngineClient:
    """Create with `await EngineClient.start(config)`; close with `await client.close()`."""

    def __init__(self, config: EngineClientConfig, handshake: HandshakeServer | None = None) -> None:
        if handshake is not None and not config.run_handshake:
            raise ValueError("a handshake socket was given to an engine client that does not run the handshake")
        self.config = config
        self.ctx = zmq.asyncio.Context()
        self.engines: list[EngineState] = []
        self.negotiation = Negotiation(None, "not negotiated yet")
        self.hasher: PromptHasher | None = None
        self.max_model_len = 0
        self._streams: dict[str, RequestStream] = {}
        self._owner: dict[str, EngineState] = {}
        self._utility_calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)
        self._router = Router(config.routing, config.client_index, config.client_count)
        self.routing_stats = RoutingStats()
        self._index: PrefixIndex | None = None
        self._subscriber: KVEventSubscriber | None = None
        self._routing_hasher: PromptHasher | None = None
        """Hashes prompts for routing when FEH is off or hashes at another block size; None: reuse FEH's blob."""
        self._routing_reason = "not started"
        self._tasks: list[asyncio.Task[None]] = []
        self._probe_wanted = asyncio.Event()
        self._sentinel_seen = False
        self._closed = False
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._sockets: EngineSockets | None = None
        self._handshake = handshake
        """The handshake socket when this client runs the handshake: given already bound, or bound in `_start`."""
        self.input_address = ""
        self.output_address = ""

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def start(cls, config: EngineClientConfig, handshake: HandshakeServer | None = None) -> EngineClient:
        """Bind, admit the engines, negotiate FEH, start the background tasks. `handshake`: the handshake socket
        already bound (`config.run_handshake`), which the client owns from here, closed on failure too."""
        client = cls(config, handshake)
        try:
            await client._start()
        except BaseException:
            await client.close()
            raise
        return client

    async def _bind(self) -> None:
        cfg = self.config
        if cfg.input_address and cfg.output_address:
            input_address, output_address = cfg.input_address, cfg.output_address
        elif _is_loopback(cfg.data_parallel_address):
            self._tmpdir = tempfile.TemporaryDirectory(prefix="pyfront-")
            base = os.path.join(self._tmpdir.name, f"{uuid.uuid4().hex[:8]}-{cfg.client_index}")
            input_address, output_address = f"ipc://{base}-in", f"ipc://{base}-out"
        else:
            host = cfg.data_parallel_address
            if ":" in host:
                host = f"[{host}]"
            input_address = output_address = f"tcp://{host}:0"
        self._sockets = await open_engine_sockets(
            self.ctx, input_address, output_address, self._on_output_message, self._on_disconnect, cfg.transport
        )
        self.input_address = self._sockets.input_address
        self.output_address = self._sockets.output_address
        self.io_threads = batch_io_threads()
        """What became of libzmq's I/O threads' scheduling (engine_client/io_threads.py): the handshake's, the KV
        events', and the engine sockets' when they are libzmq's."""

    async def _start(self) -> None:
        cfg = self.config
        deadline = time.monotonic() + cfg.startup_timeout_s
        await self._bind()
        if cfg.run_handshake:
            if cfg.client_count != 1:
                raise ValueError("run the handshake for several front-end processes with run_handshake()")
            if self._handshake is None:
                self._handshake = HandshakeServer(
                    handshake_address(cfg.data_parallel_address, cfg.data_parallel_rpc_port),
                    cfg.data_parallel_size,
                    self.ctx,
                )
            await self._handshake.startup(
                [ClientAddresses(self.input_address, self.output_address)], cfg.startup_timeout_s
            )
        registrations = await self._collect_registrations(deadline)
        self.engines = [EngineState(rank, engine_identity(rank), registrations[rank]) for rank in sorted(registrations)]
        self.max_model_len = min(reg.max_model_len for reg in registrations.values())
        enabled = feh_enabled_by_env() if cfg.feh_enabled is None else cfg.feh_enabled
        self.negotiation = negotiate(registrations, enabled)
        logger.info("front-end block hashing: %s", self.negotiation.reason)
        if self.negotiation.config is not None:
            self.hasher = PromptHasher(self.negotiation.config, max_threads=cfg.hash_threads)
        self._start_routing()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._health_loop(), name="pyfront-engine-health"),
            loop.create_task(self._registration_loop(), name="pyfront-engine-registrations"),
        ]
        if self._handshake is not None:
            self._tasks.append(loop.create_task(self._handshake.serve_restarts(), name="pyfront-engine-handshake"))

    async def _collect_registrations(self, deadline: float) -> dict[int, EngineCoreReadyResponse]:
        """One registration per engine on our input socket (they may have arrived before READY)."""
        assert self._sockets is not None
        expected = set(range(self.config.data_parallel_size))
        registrations: dict[int, EngineCoreReadyResponse] = {}
        while len(registrations) < len(expected):
            try:
                frames = await asyncio.wait_for(self._sockets.recv_input(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                missing = sorted(expected - set(registrations))
                raise HandshakeError(
                    f"engine ranks {missing} never registered on {self.input_address} "
                    f"within {self.config.startup_timeout_s:g}s"
                ) from None
            identity, payload = frames[0], frames[-1]
            rank = identity_rank(identity)
            if rank not in expected:
                raise HandshakeError(f"registration from unexpected identity {identity.hex()}")
            try:
                registrations[rank] = codec.decode_ready_response(payload)
            except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
                raise HandshakeError(f"malformed registration from engine rank {rank}: {exc}") from None
        return registrations

    async def close(self) -> None:
        """Abort what is in flight, stop the tasks, close the sockets."""
        if self._closed:
            return
        self._closed = True
        for engine in self.engines:
            if engine.in_flight and engine.connected:
                with contextlib.suppress(EngineError, zmq.ZMQError):
                    self._send(engine, codec.encode_abort(sorted(engine.in_flight)))
        for stream in self._streams.values():
            stream.fail(EngineUnavailableError("the engine client is shutting down"))
        self._streams.clear()
        self._owner.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for future in self._utility_calls.values():
            if not future.done():
                future.set_exception(EngineUnavailableError("the engine client is shutting down"))
        if self._sockets is not None:
            await self._sockets.close()
        if self._handshake is not None:
            self._handshake.close()
        if self._subscriber is not None:
            self._subscriber.close()
        self.ctx.term()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()

    # ------------------------------------------------------------------ state

    @property
    def healthy(self) -> bool:
        if self._closed:
            return False
        for engine in self.engines:  # noqa: SIM110  (every request asks: any() over a generator costs more)
            if engine.healthy:
                return True
        return False

    def health(self) -> dict[str, Any]:
        """The `/health` body: overall health, the ranks out of service, each engine, FEH's state."""
        return {
            "healthy": self.healthy,
            "degraded_ranks": [e.rank for e in self.engines if not e.healthy],
            "engines": [
                {
                    "rank": e.rank,
                    "healthy": e.healthy,
                    "status": e.status,
                    "in_flight": e.num_in_flight,
                    "waiting": e.num_waiting,
                    "running": e.num_running,
                    "kv_cache_usage": e.kv_cache_usage,
                    "restarts": e.restarts,
                    "routing": self._engine_routing_health(e.rank),
                }
                for e in self.engines
            ],
            "front_end_block_hashing": self.negotiation.reason,
            "routing": {"policy": self.config.routing.policy, "state": self._routing_reason},
        }

    def _engine_routing_health(self, rank: int) -> dict[str, Any]:
        """One engine's prefix index: how it is keyed and why, its size, and its event feed."""
        if self._index is None:
            return {"mode": "off", "reason": self._routing_reason}
        status = self._index.status(rank)
        report: dict[str, Any] = {
            "mode": status.mode,
            "approximate": status.mode == APPROXIMATE,
            "reason": status.reason,
            "blocks": status.blocks,
            "blocks_stored": status.stored,
            "blocks_removed": status.removed,
            "blocks_skipped": status.skipped,
            "clears": status.clears,
        }
        source = self._subscriber.status(rank) if self._subscriber is not None else None
        if source is not None:
            report["kv_events"] = {
                "endpoint": source.endpoint,
                "subscriber_binds": source.subscriber_binds,
                "replay_endpoint": source.replay_endpoint,
                "batches": source.batches,
                "gaps": source.gaps,
                "replayed": source.replayed,
                "undecodable": source.undecodable,
                "silent": source.silent,
                "last_batch_age_s": source.last_batch_age_s,
                "last_error": source.last_error,
            }
        return report

    # ------------------------------------------------------------------ routing

    def routing_report(self) -> RoutingReport:
        """The routing metrics: decisions, prediction accuracy, each healthy engine's load and index mode."""
        index = self._index
        engines = tuple(
            EngineRouting(
                e.rank,
                index.mode(e.rank) if index is not None else "off",
                self._router.score(e),
                index.status(e.rank).blocks if index is not None else 0,
            )
            for e in self.engines
            if e.healthy
        )
        return RoutingReport(self.config.routing.policy, self.routing_stats, engines)

    def _start_routing(self) -> None:
        """Build the prefix index and subscribe to every engine's KV events (or fall back to approximate)."""
        cfg = self.config
        if not cfg.routing.cache_aware:
            self._routing_reason = "--routing load: load alone, as vLLM's front end"
            return
        if len(self.engines) == 1:  # nothing to choose: no index, no per-request keys or lookups
            self._routing_reason = "one engine: every request goes to it"
            return
        sizes = {e.registration.block_size for e in self.engines}
        if len(sizes) != 1:
            self._routing_reason = f"engines report different block sizes {sorted(sizes)}: routing on load alone"
            logger.warning("cache-aware routing is off: %s", self._routing_reason)
            return
        block_size = sizes.pop()
        if self.hasher is not None and self.hasher.config.block_size == block_size:
            hash_config = self.hasher.config
        else:
            hash_config = HashConfig.default(block_size)
            self._routing_hasher = PromptHasher(hash_config, max_threads=cfg.hash_threads)
        self._index = PrefixIndex(len(self.engines), hash_config, max_blocks=cfg.routing.index_max_blocks)
        self._subscriber = KVEventSubscriber(self._index, silence_timeout_s=cfg.routing.silence_timeout_s)
        for engine in self.engines:
            self._subscribe(engine)
        self._subscriber.start()  # idle (a 100 ms wait, polling nothing) while no engine publishes
        self._routing_reason = f"cache-aware on {block_size}-token blocks ({hash_config.describe()})"
        logger.info("routing: %s", self._routing_reason)

    def _kv_events_endpoints(self, engine: EngineState) -> tuple[KVEventsEndpoints | None, str]:
        cfg = self.config
        hosts = list(cfg.kv_events_hosts)
        host = hosts[engine.rank] if len(hosts) > 1 else (hosts[0] if hosts else "127.0.0.1")
        config: dict[str, Any] | None
        if cfg.kv_events_config is not None:
            config, offset, origin = cfg.kv_events_config, True, "--kv-events-config"
        else:
            config, offset, origin = engine.registration.kv_events_config, False, "the engine's registration"
        try:
            endpoints = resolve_endpoints(config, engine.rank, host, offset=offset)
        except (ValueError, TypeError) as exc:
            return None, f"{origin} gives no usable KV events endpoint: {exc}"
        if endpoints is None:
            return None, (
                "no KV events (neither --kv-events-config nor the engine's registration names a zmq publisher): "
                "approximate, from where pyfront sent each prompt"
            )
        if endpoints.subscriber_binds and cfg.client_count > 1 and cfg.client_index != 0:
            return None, (
                f"the engine connects to {endpoints.endpoint}, which API server 0 binds: this one is approximate "
                "(give the engines a tcp://*:PORT endpoint so that every API server can subscribe)"
            )
        return endpoints, origin

    def _subscribe(self, engine: EngineState) -> None:
        """(Re)start `engine`'s index: subscribed to its events, or approximate with the reason."""
        assert self._index is not None and self._subscriber is not None
        endpoints, why = self._kv_events_endpoints(engine)
        if endpoints is None:
            self._index.set_mode(engine.rank, APPROXIMATE, why)
            logger.warning("routing for engine rank %d is approximate: %s", engine.rank, why)
            return
        mode, reason = initial_mode(self._routing_hasher is None)
        try:
            self._subscriber.add(engine.rank, endpoints, mode, f"{reason} (events from {why})")
        except zmq.ZMQError as exc:
            why = f"cannot subscribe to {endpoints.endpoint}: {exc}; approximate"
            self._index.set_mode(engine.rank, APPROXIMATE, why)
            logger.error("routing for engine rank %d: %s", engine.rank, why)

    async def _route(self, request: EngineCoreRequest) -> tuple[EngineState, Prediction | None, list[int]]:
        """The engine for an unpinned request, what it should report cached, and the block keys it lacked."""
        index = self._index
        prompt = request.prompt_token_ids
        keys: list[int] = []
        prefixes: list[int] | None = None
        if index is not None and prompt is not None and len(prompt) >= index.block_size and feh_eligible(request):
            if self._routing_hasher is None:
                blob = request.prompt_block_hashes
            else:
                blob = await self._routing_hasher.hash_prompt(prompt, request.cache_salt, checked=True)
            keys = prompt_keys(blob, index.block_size, len(prompt))
            if len(keys) <= INLINE_LOOKUP_BLOCKS:
                prefixes = index.longest_prefixes(keys)
            else:
                prefixes = await asyncio.to_thread(index.longest_prefixes, keys)
        return self._pick(request, keys, prefixes)

    def _pick(
        self, request: EngineCoreRequest, keys: list[int], prefixes: list[int] | None
    ) -> tuple[EngineState, Prediction | None, list[int]]:
        """`_route`'s choice once the prompt's block keys and the engines' cached prefixes are known (none without
        an index: one engine, whose requests skip `_route`'s coroutine)."""
        index = self._index
        prompt = request.prompt_token_ids
        num_tokens = len(prompt) if prompt is not None else 0
        decision = self._router.pick(self.engines, num_tokens, prefixes, index.block_size if index else 1)
        if decision is None:
            raise EngineUnavailableError("no healthy engine")
        engine = decision.engine
        if index is None or not keys:
            self.routing_stats.decided(decision.reason, "none")
            return engine, None, keys
        source = "approximate" if index.mode(engine.rank) == APPROXIMATE else "events"
        self.routing_stats.decided(decision.reason, source)
        stored_from = len(keys) * index.block_size
        # Approximate index: record only what the engine did not hold already (the walk just proved the rest).
        new_keys = keys[prefixes[engine.rank] :] if prefixes is not None else keys
        seen = self._subscriber.batches_received(engine.rank) if self._subscriber is not None else 0
        return engine, Prediction(engine.rank, decision.cached_tokens, stored_from, source, seen), new_keys

    async def _record_sent(self, rank: int, keys: list[int]) -> None:
        """Approximate index: the prompt's blocks are now (about to be) on `rank`."""
        index = self._index
        if index is None or not keys or index.mode(rank) != APPROXIMATE:
            return
        if len(keys) <= INLINE_LOOKUP_BLOCKS:
            index.record_sent(rank, keys)
        else:
            await asyncio.to_thread(index.record_sent, rank, keys)

    def _check_prediction(self, stream: RequestStream, output: EngineCoreOutput) -> None:
        """The first output of a routed request: compare the prediction with the engine's num_cached_tokens."""
        prediction = stream.prediction
        stream.prediction = None
        stats = output.prefill_stats
        if prediction is None or stats is None:
            return
        reported = stats.num_cached_tokens
        self.routing_stats.checked(prediction.cached_tokens, reported)
        subscriber = self._subscriber
        if (
            subscriber is not None
            and reported < prediction.stored_from_tokens
            and self._index is not None
            and self._index.mode(prediction.rank) in EVENT_MODES
        ):
            subscriber.expect_events(prediction.rank, prediction.batches_before)

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # ------------------------------------------------------------------ requests

    def _send(self, engine: EngineState, frames: list, *, at_once: bool = False) -> None:
        """Send `[type, payload, aux...]` to one engine; a vanished engine is marked dead at once.

        `at_once`: see `EngineSockets.send`. Not a coroutine: the sockets' `send` only queues or writes, and a
        coroutine object per request costs more than the call."""
        assert self._sockets is not None
        try:
            self._sockets.send(engine.identity, frames, at_once=at_once)
        except EngineUnreachable:
            self._mark_dead(engine, "disconnected", "the engine process is gone (no connection has its identity)")
            raise EngineDeadError(f"engine rank {engine.rank} is gone") from None

    async def add_request(
        self,
        request: EngineCoreRequest,
        *,
        rank: int | None = None,
        prompt_block_hashes: bytes | None = None,
        trusted: bool = False,
    ) -> RequestStream:
        """Validate, hash (when negotiated), route and send one request; returns its output stream.

        `prompt_block_hashes` lets n>1 children share their parent's hashes
        (docs/engine-protocol.md#feh-negotiation, rule 4).
        `trusted`: the ids come from a tokenizer (or were range-checked) and the sampling parameters were
        validated by the caller, so those checks are not repeated on the event loop.
        """
        if self._closed:
            raise EngineUnavailableError("the engine client is closed")
        request.client_index = self.config.client_index
        validate_request(request, self.max_model_len, self.config.client_count, trusted=trusted)
        if request.request_id in self._streams:
            raise DuplicateRequestError(f"request id {request.request_id!r} is already in flight")
        if self.hasher is not None and feh_eligible(request):
            if prompt_block_hashes is None:
                assert request.prompt_token_ids is not None
                # validate_request made sure (or the trusted caller did) that the ids are exact int32 ints.
                prompt_block_hashes = await self.hasher.hash_prompt(
                    request.prompt_token_ids, request.cache_salt, checked=True
                )
            # FEH may have been turned off while hashing (a restarted engine with another config): send none.
            request.prompt_block_hashes = prompt_block_hashes if self.hasher is not None else None
        else:
            request.prompt_block_hashes = None
        block_hashes = request.prompt_block_hashes is not None
        if request.prompt_token_ids is not None and len(request.prompt_token_ids) > INLINE_ENCODE_TOKENS:
            encode = functools.partial(codec.encode_add, request, block_hashes=block_hashes)
            frames = await asyncio.get_running_loop().run_in_executor(None, encode)
        else:
            frames = codec.encode_add(request, block_hashes=block_hashes)
        if rank is None:
            rank = request.data_parallel_rank
        prediction: Prediction | None = None
        keys: list[int] = []
        if rank is not None:
            if not 0 <= rank < len(self.engines):
                raise ValueError(f"data_parallel_rank {rank} is out of range [0, {len(self.engines)})")
            engine = self.engines[rank]
            if not engine.healthy:
                raise EngineUnavailableError(f"engine rank {rank} is {engine.status}")
            self.routing_stats.decided("explicit", "none")
        elif self._index is None:
            engine, prediction, keys = self._pick(request, [], None)
        else:
            engine, prediction, keys = await self._route(request)
        if request.request_id in self._streams:  # re-check: hashing and encoding awaited
            raise DuplicateRequestError(f"request id {request.request_id!r} is already in flight")
        if not engine.healthy:  # it may have died while the prompt was hashed, encoded or looked up
            raise EngineUnavailableError(f"engine rank {engine.rank} is {engine.status}")
        stream = RequestStream(request.request_id, engine.rank)
        stream.prediction = prediction
        self._streams[request.request_id] = stream
        self._owner[request.request_id] = engine
        idle = not engine.in_flight
        engine.in_flight.add(request.request_id)
        try:
            self._send(engine, frames, at_once=idle)
        except BaseException:
            self._forget(request.request_id)
            raise
        engine.requests_sent += 1
        if keys:
            await self._record_sent(engine.rank, keys)
        return stream

    def _forget(self, request_id: str) -> RequestStream | None:
        stream = self._streams.pop(request_id, None)
        engine = self._owner.pop(request_id, None)
        if engine is not None:
            engine.in_flight.discard(request_id)
        return stream

    async def abort(self, request_ids: Iterable[str]) -> None:
        """Abort requests (batched per engine); their streams end at once, the engine sends nothing."""
        by_engine: dict[int, list[str]] = {}
        for request_id in request_ids:
            engine = self._owner.get(request_id)
            stream = self._forget(request_id)
            if stream is not None:
                stream.fail(RequestAbortedError(f"request {request_id!r} was aborted"), finished=True)
            if engine is not None and engine.connected:
                by_engine.setdefault(engine.rank, []).append(request_id)
        for rank, ids in by_engine.items():
            with contextlib.suppress(EngineDeadError):
                self._send(self.engines[rank], codec.encode_abort(ids))

    async def call_utility(
        self, method: str, *args: Any, rank: int | None = None, timeout_s: float | None = None
    ) -> Any:
        """Call an engine method by name on one engine (rank) or on every healthy engine (first result)."""
        targets = [self.engines[rank]] if rank is not None else [e for e in self.engines if e.healthy]
        if not targets:
            raise EngineUnavailableError("no healthy engine")
        timeout = self.config.utility_timeout_s if timeout_s is None else timeout_s
        results = await asyncio.gather(*(self._call_one(e, method, args, timeout) for e in targets))
        return results[0]

    async def _call_one(self, engine: EngineState, method: str, args: Sequence[Any], timeout: float) -> Any:
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._utility_calls[call_id] = future
        try:
            self._send(engine, codec.encode_utility(self.config.client_index, call_id, method, args))
            return await asyncio.wait_for(future, timeout)
        finally:
            self._utility_calls.pop(call_id, None)

    # ------------------------------------------------------------------ outputs

    def _on_output_message(self, frames: list[bytes]) -> None:
        """Route one EngineCoreOutputs message: each output to its stream, once, in order."""
        decode = codec.decode_outputs
        streams = self._streams
        if codec.is_engine_core_dead(frames):
            logger.error("an engine sent ENGINE_CORE_DEAD; probing every engine")
            self._sentinel_seen = True
            self._probe_wanted.set()
            return
        try:
            batch = decode(frames)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            logger.error("dropping an undecodable engine output (%d frames): %s", len(frames), exc)
            return
        index = batch.engine_index
        engine = self.engines[index] if 0 <= index < len(self.engines) else None
        if engine is not None:
            engine.last_seen = time.monotonic()
            stats = batch.scheduler_stats
            if stats is not None:
                engine.num_waiting = stats.num_waiting_reqs
                engine.num_running = stats.num_running_reqs
                engine.kv_cache_usage = stats.kv_cache_usage
        for output in batch.outputs:
            stream = streams.get(output.request_id)
            if stream is None:
                continue  # aborted here already: drop silently
            if stream.prediction is not None:
                self._check_prediction(stream, output)
            stream.push(output)
            if output.finish_reason is not None:
                self._forget(output.request_id)
        if batch.finished_requests:
            for request_id in batch.finished_requests:
                self._forget(request_id)
        utility = batch.utility_output
        if utility is not None:
            future = self._utility_calls.get(utility.call_id)
            if future is not None and not future.done():
                if utility.failure_message is not None:
                    future.set_exception(EngineError(utility.failure_message))
                else:
                    future.set_result(utility.result.result if utility.result is not None else None)

    # ------------------------------------------------------------------ engines that come back

    async def _registration_loop(self) -> None:
        """For the life of the client: read the input ROUTER, where only (re-)registrations arrive."""
        assert self._sockets is not None
        while True:
            self._on_registration(await self._sockets.recv_input())

    def _on_registration(self, frames: list[bytes]) -> None:
        """A registration after start-up: re-admit its rank; anything else is logged and dropped."""
        identity, payload = frames[0], frames[-1]
        rank = identity_rank(identity)
        if rank is None or not 0 <= rank < len(self.engines):
            logger.warning(
                "ignoring a registration from identity %s on %s: not one of the ranks 0..%d this front end serves",
                identity.hex(),
                self.input_address,
                len(self.engines) - 1,
            )
            return
        try:
            registration = codec.decode_ready_response(payload)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            logger.error("ignoring a malformed registration from engine rank %d: %s", rank, exc)
            return
        self._readmit(rank, registration)

    def _readmit(self, rank: int, registration: EngineCoreReadyResponse) -> None:
        """A rank registered again: a new engine process. Replace its state, fail what the old one held.

        Whatever the old state said (disconnected, stalled, or healthy: a second process for a rank that
        still looked fine), the registration comes from a process that never heard of this front end's
        requests, so the old in-flight requests can only fail. The old `EngineState` is marked replaced and
        dropped: late events about it (a ping that times out, an EHOSTUNREACH) must not touch the new one.
        """
        old = self.engines[rank]
        was = "healthy" if old.healthy else old.status
        stale = sorted(old.in_flight)
        error = EngineDeadError(f"engine rank {rank} restarted; the request was lost with the old engine process")
        for request_id in stale:
            stream = self._forget(request_id)
            if stream is not None:
                stream.fail(error)
        old.healthy, old.connected, old.status = False, False, "replaced"
        self.engines[rank] = EngineState(rank, old.identity, registration, restarts=old.restarts + 1)
        logger.warning(
            "engine rank %d registered again (restart %d; it was %s): failed %d stale in-flight request(s); "
            "back in service",
            rank,
            old.restarts + 1,
            was,
            len(stale),
        )
        self._renegotiate(rank)
        if self._index is not None:
            self._subscribe(self.engines[rank])
        max_model_len = min(e.registration.max_model_len for e in self.engines)
        if max_model_len != self.max_model_len:
            logger.warning(
                "max_model_len is now %d (was %d) after rank %d restarted", max_model_len, self.max_model_len, rank
            )
            self.max_model_len = max_model_len

    def _renegotiate(self, rank: int) -> None:
        """FEH over the current registrations: it stays on only if the restarted engine advertises the same config.

        It never turns on after start-up: an engine that comes back with another advertisement means the
        deployment is changing (a rolling restart with new settings); the operator restarts pyfront once
        every engine runs the new configuration, rather than pyfront flipping between hashed and unhashed.
        """
        current = self.negotiation.config
        if current is None:
            return
        outcome = negotiate({e.rank: e.registration for e in self.engines}, True)
        if outcome.config == current:
            return
        self.negotiation = Negotiation(None, f"turned off after engine rank {rank} restarted: {outcome.reason}")
        self.hasher = None
        logger.warning("front-end block hashing: %s", self.negotiation.reason)
        if self._index is not None and self._routing_hasher is None:
            # Routing reused FEH's hashes and trusted the engines' as equal by construction: hash for routing
            # from now on, and verify every engine's hashes again.
            self._routing_hasher = PromptHasher(self._index.hash_config, max_threads=self.config.hash_threads)
            for engine in self.engines:
                self._subscribe(engine)

    def _is_current(self, engine: EngineState) -> bool:
        """False for the state of an engine process that a restart replaced."""
        return self.engines[engine.rank] is engine

    # ------------------------------------------------------------------ health

    def _mark_dead(self, engine: EngineState, status: str, reason: str) -> None:
        """Take an engine out of service and fail its in-flight requests with EngineDeadError."""
        if (not engine.healthy and engine.status == status) or not self._is_current(engine):
            return
        engine.healthy = False
        engine.status = status
        if status == "disconnected":
            engine.connected = False
            if self._index is not None:
                self._index.clear(engine.rank, "the engine process is gone")
        failed = sorted(engine.in_flight)
        logger.error(
            "engine rank %d is %s (%s); failing %d in-flight request(s)",
            engine.rank,
            status,
            reason,
            len(failed),
        )
        error = EngineDeadError(f"engine rank {engine.rank} is {status}: {reason}")
        for request_id in failed:
            stream = self._forget(request_id)
            if stream is not None:
                stream.fail(error)
        if status == "stalled" and failed:
            # The process is alive: make sure it does not keep running requests nobody reads.
            asyncio.get_running_loop().create_task(self._abort_quietly(engine, failed))

    async def _abort_quietly(self, engine: EngineState, request_ids: list[str]) -> None:
        with contextlib.suppress(EngineError, zmq.ZMQError):
            self._send(engine, codec.encode_abort(request_ids))

    async def _ping(self, engine: EngineState, timeout: float, *, stall_on_timeout: bool = True) -> None:
        try:
            await self._call_one(engine, PING_METHOD, (), timeout)
        except EngineDeadError:
            return  # marked disconnected by _send
        except TimeoutError:
            if engine.connected and stall_on_timeout:
                self._mark_dead(engine, "stalled", f"no answer to a ping within {timeout:g}s")
            return
        except EngineError:
            pass  # it answered, if only with a failure: alive
        engine.last_seen = time.monotonic()
        if not engine.healthy and engine.connected and self._is_current(engine):
            logger.warning("engine rank %d answers again; back in service", engine.rank)
            engine.healthy = True
            engine.status = "ok"

    async def _probe_all(self, timeout: float, *, stall_on_timeout: bool) -> None:
        await asyncio.gather(
            *(self._ping(e, timeout, stall_on_timeout=stall_on_timeout) for e in self.engines if e.connected)
        )

    def _on_disconnect(self, endpoint: str) -> None:
        logger.warning("an engine connection to %s dropped; probing", endpoint)
        self._probe_wanted.set()

    async def _health_loop(self) -> None:
        cfg = self.config
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._probe_wanted.wait(), cfg.ping_interval_s)
            if self._probe_wanted.is_set():
                self._probe_wanted.clear()
                # After ENGINE_CORE_DEAD some engine is going down even if its socket is still open:
                # whichever does not answer within 2 s is taken to be it. After a mere disconnect, a
                # send to the vanished engine fails at once (ROUTER_MANDATORY), so a slow answer from
                # a busy engine is no evidence.
                sentinel, self._sentinel_seen = self._sentinel_seen, False
                await asyncio.sleep(0.05)  # ZMQ drops the peer's route a moment after the event
                await self._probe_all(min(cfg.stall_timeout_s, 2.0), stall_on_timeout=sentinel)
                continue
            now = time.monotonic()
            quiet = [
                e for e in self.engines if e.connected and (not e.healthy or now - e.last_seen >= cfg.ping_interval_s)
            ]
            if quiet:
                await asyncio.gather(*(self._ping(e, cfg.stall_timeout_s) for e in quiet))
