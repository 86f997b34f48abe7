"""Subscribe to every engine's KV events and keep the prefix index in step with them, on one thread.

One SUB socket per engine rank (bound when the engine's publisher connects, connected when it binds: see
`kv_events`), one DEALER per rank with a replay endpoint. The thread decodes each batch and applies it to the
`PrefixIndex`; nothing here runs on the event loop, so a burst of events (an engine evicting thousands of
blocks) costs the HTTP side only GIL time.

Sequence numbers (per publisher, from 0):
- the next expected one arrives: apply it;
- a later one (a gap: the SUB's high-water mark dropped some, or the subscription started late): ask the
  replay endpoint for everything from the first missing one, apply what comes back in order, and drop live
  batches already applied. Without a replay endpoint, or when the engine's replay buffer no longer holds
  the first missing batch, the missed events may have removed blocks, so the engine's entries are cleared
  (a miss costs a prefill; a stale hit would send the conversation where its prefix no longer is);
- seq 0 again, or an earlier one than expected: the publisher restarted (the engine process did): clear;
- older duplicates (after a replay): dropped.

Silence: an engine that should have published (a request it served stored new blocks, `expect_events`)
but sent nothing for `silence_timeout_s` is taken to have stopped publishing: its entries are cleared and it
falls back to the approximate index until its events resume.

Control (restarts, expectations, close) comes from the event loop through a queue read by the thread, so
every socket stays on the thread that made it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import zmq

from pyfront.engine_client.io_threads import batch_io_threads
from pyfront.engine_client.kv_events import END_SEQ, KVEventsEndpoints, decode_batch
from pyfront.engine_client.prefix_index import APPROXIMATE, ENGINE_HASHES, VERIFYING, PrefixIndex

logger = logging.getLogger(__name__)

POLL_MS = 100
REPLAY_TIMEOUT_S = 2.0


@dataclass(slots=True)
class _Source:
    rank: int
    endpoints: KVEventsEndpoints
    sub: zmq.Socket[bytes]
    replay: zmq.Socket[bytes] | None
    start_mode: str
    start_reason: str
    expected: int | None = None
    """The next sequence number; None until the first batch."""
    last_batch_at: float = 0.0
    expecting_since: float | None = None
    silent: bool = False
    batches: int = 0
    gaps: int = 0
    replayed: int = 0
    undecodable: int = 0
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class SourceStatus:
    endpoint: str
    subscriber_binds: bool
    replay_endpoint: str | None
    batches: int
    gaps: int
    replayed: int
    undecodable: int
    silent: bool
    last_batch_age_s: float | None
    last_error: str


class KVEventSubscriber:
    """Owns the sockets and the thread; `start()` binds/connects at once so bind errors surface to the caller."""

    def __init__(
        self,
        index: PrefixIndex,
        *,
        silence_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.silence_timeout_s = silence_timeout_s
        self._clock = clock
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sources: dict[int, _Source] = {}
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ control (any thread)

    def add(self, rank: int, endpoints: KVEventsEndpoints, mode: str, reason: str) -> None:
        """Subscribe to `rank` (before `start`, or later through the thread): its entries start empty in `mode`."""
        if self._thread is None:
            self._open(rank, endpoints, mode, reason)
        else:
            self._commands.put(("add", (rank, endpoints, mode, reason)))

    def batches_received(self, rank: int) -> int:
        """Batches applied from `rank` so far (read from any thread: one int of a dict entry)."""
        source = self._sources.get(rank)
        return source.batches if source is not None else 0

    def expect_events(self, rank: int, batches_before: int) -> None:
        """`rank` stored new blocks for a request routed when `batches_before` of its batches had arrived (its
        first output said so): a batch must have followed since, or follow soon.

        The count, not the moment of the call, is the reference: an engine publishes a step's events before it
        sends that step's outputs (vLLM and the mock both do), so the batch holding this request's blocks has
        often been applied already by the time its first output arrives.
        """
        self._commands.put(("expect", (rank, batches_before)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pyfront-kv-events", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for source in self._sources.values():
            self._close_source(source)
        self._sources.clear()
        self._ctx.term()

    def status(self, rank: int) -> SourceStatus | None:
        source = self._sources.get(rank)
        if source is None:
            return None
        age = self._clock() - source.last_batch_at if source.batches else None
        ep = source.endpoints
        return SourceStatus(
            ep.endpoint,
            ep.subscriber_binds,
            ep.replay_endpoint,
            source.batches,
            source.gaps,
            source.replayed,
            source.undecodable,
            source.silent,
            age,
            source.last_error,
        )

    # ------------------------------------------------------------------ sockets (the thread, or before start)

    def _open(self, rank: int, endpoints: KVEventsEndpoints, mode: str, reason: str) -> None:
        old = self._sources.pop(rank, None)
        if old is not None:
            self._close_source(old)
        sub = self._ctx.socket(zmq.SUB)
        batch_io_threads()  # this context's I/O thread too (engine_client/io_threads.py)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, endpoints.topic.encode())
        if endpoints.subscriber_binds:
            try:
                sub.bind(endpoints.endpoint)
            except zmq.ZMQError as exc:
                if not endpoints.registered or exc.errno not in (zmq.EADDRINUSE, zmq.EADDRNOTAVAIL):
                    sub.close(0)
                    raise
                # vLLM binds `tcp://*:0` on the engine's IP and a port of the OS's choosing and registers that
                # address, which reads as an endpoint the engine connects to. Taken (the engine on this host
                # holds it) or not an address of this host: the engine bound it, so connect. Only for a
                # registered address: one from pyfront's own flag is the engine's to connect to (a port still
                # taken is retried by the caller, never connected to).
                logger.info("KV events of engine rank %d: %s is bound already (%s): connecting to it",
                            rank, endpoints.endpoint, exc)  # fmt: skip
                endpoints = replace(endpoints, subscriber_binds=False)
                sub.connect(endpoints.endpoint)
        else:
            sub.connect(endpoints.endpoint)
        replay = None
        if endpoints.replay_endpoint:
            replay = self._ctx.socket(zmq.DEALER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.connect(endpoints.replay_endpoint)
        self._sources[rank] = _Source(rank, endpoints, sub, replay, mode, reason)
        self.index.set_mode(rank, mode, reason)
        logger.info(
            "KV events of engine rank %d: %s %s (replay %s); index %s: %s",
            rank,
            "binding" if endpoints.subscriber_binds else "connecting to",
            endpoints.endpoint,
            endpoints.replay_endpoint or "none",
            mode,
            reason,
        )

    @staticmethod
    def _close_source(source: _Source) -> None:
        source.sub.close(0)
        if source.replay is not None:
            source.replay.close(0)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        poller = zmq.Poller()
        registered: dict[zmq.Socket[bytes], int] = {}

        def sync_poller() -> None:
            for sock in list(registered):
                if all(s.sub is not sock for s in self._sources.values()):
                    poller.unregister(sock)
                    del registered[sock]
            for source in self._sources.values():
                if source.sub not in registered:
                    poller.register(source.sub, zmq.POLLIN)
                    registered[source.sub] = source.rank

        sync_poller()
        while not self._stop.is_set():
            changed = self._drain_commands()
            if changed:
                sync_poller()
            if not registered:
                # zmq.Poller.poll returns at once when it has no sockets: wait here instead of spinning.
                self._stop.wait(POLL_MS / 1000)
                continue
            for sock, _ in poller.poll(POLL_MS):
                rank = registered.get(sock)
                source = self._sources.get(rank) if rank is not None else None
                if source is None:
                    continue
                for _ in range(256):  # bounded per wake-up, so commands and other ranks get their turn
                    try:
                        frames = source.sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_message(source, frames)
            self._check_silence()

    def _drain_commands(self) -> bool:
        changed = False
        while True:
            try:
                kind, arg = self._commands.get_nowait()
            except queue.Empty:
                return changed
            if kind == "add":
                rank, endpoints, mode, reason = arg
                try:
                    self._open(rank, endpoints, mode, reason)
                except zmq.ZMQError as exc:
                    logger.error("cannot subscribe to the KV events of engine rank %d: %s", rank, exc)
                    self.index.set_mode(rank, APPROXIMATE, f"subscribing to {endpoints.endpoint} failed: {exc}")
                changed = True
            elif kind == "expect":
                rank, batches_before = arg
                source = self._sources.get(rank)
                if source is not None and source.batches <= batches_before and source.expecting_since is None:
                    source.expecting_since = self._clock()

    def _check_silence(self) -> None:
        now = self._clock()
        for source in self._sources.values():
            since = source.expecting_since
            if since is None or source.silent or now - since < self.silence_timeout_s:
                continue
            source.silent = True
            source.expecting_since = None
            reason = (
                f"no KV events for {now - since:.0f} s after the engine stored new blocks "
                f"(is --kv-events-config set on it, with prefix caching on?): approximate until its events resume"
            )
            logger.warning("engine rank %d: %s", source.rank, reason)
            self.index.set_mode(source.rank, APPROXIMATE, reason)

    def _on_message(self, source: _Source, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            source.undecodable += 1
            source.last_error = f"a message of {len(frames)} frames is not [topic, seq, payload]"
            return
        seq = int.from_bytes(frames[1], "big")
        if source.silent:
            source.silent = False
            self.index.set_mode(source.rank, source.start_mode, f"{source.start_reason} (events resumed)")
            logger.warning("engine rank %d publishes KV events again", source.rank)
            source.expected = None
        expected = source.expected
        if expected is None:
            if seq != 0:  # subscribed after the engine started publishing: fetch what it published so far
                self._catch_up(source, 0, seq, initial=True)
            source.expected = max(seq, source.expected or 0)
            expected = source.expected
        if seq < expected:
            if seq == 0:
                self._restarted(source)
                expected = 0
            else:
                return  # already applied (from a replay)
        elif seq > expected:
            source.gaps += 1
            self._catch_up(source, expected, seq)
            if source.expected is not None and seq < source.expected:
                return  # the replay went past this one
        self._apply(source, seq, frames[2])

    def _restarted(self, source: _Source) -> None:
        logger.warning("engine rank %d: its KV event sequence started again (restart): entries cleared", source.rank)
        self.index.set_mode(source.rank, source.start_mode, f"{source.start_reason} (publisher restarted)")
        source.expected = 0

    def _apply(self, source: _Source, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except msgspec.DecodeError as exc:
            source.undecodable += 1
            source.last_error = f"batch {seq}: {exc}"
            logger.error("engine rank %d: undecodable KV event batch %d: %s", source.rank, seq, exc)
        else:
            self.index.apply(source.rank, batch)
        source.expected = seq + 1
        source.batches += 1
        source.last_batch_at = self._clock()
        source.expecting_since = None

    def _catch_up(self, source: _Source, start: int, upto: int, *, initial: bool = False) -> None:
        """Apply batches `start`.. from the replay endpoint; clear the engine if those before `upto` cannot all be had.

        `initial`: the subscription started late; nothing was indexed yet, so a replay that cannot reach back
        to `start` loses nothing already known and clears nothing.
        """
        replay = source.replay
        if replay is None:
            if not initial:
                self.index.clear(
                    source.rank, f"KV events {start}..{upto - 1} were missed and there is no replay endpoint"
                )
            return
        replay.send_multipart([b"", start.to_bytes(8, "big")])
        deadline = time.monotonic() + REPLAY_TIMEOUT_S
        first: int | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not replay.poll(int(remaining * 1000) + 1):
                source.last_error = f"replay from {start} timed out"
                logger.warning("engine rank %d: KV event replay from %d timed out", source.rank, start)
                # A late answer must not be read as the answer to the next request: start a new connection.
                replay.close(0)
                source.replay = replay = self._ctx.socket(zmq.DEALER)
                replay.setsockopt(zmq.LINGER, 0)
                assert source.endpoints.replay_endpoint is not None
                replay.connect(source.endpoints.replay_endpoint)
                if not initial and (source.expected or 0) < upto:
                    self.index.clear(source.rank, f"KV events {start}..{upto - 1} were missed and the replay timed out")
                return
            frames = replay.recv_multipart()
            if len(frames) < 3:
                continue
            seq_bytes, payload = frames[-2], frames[-1]
            if seq_bytes == END_SEQ:
                if not initial and (source.expected or 0) < upto:
                    self.index.clear(source.rank, f"KV events {start}..{upto - 1} are not in the replay buffer")
                return
            seq = int.from_bytes(seq_bytes, "big")
            if first is None:
                first = seq
                if seq > start and not initial:
                    # The buffer lost the first ones: what is left cannot make the index whole.
                    self.index.clear(source.rank, f"KV events {start}..{seq - 1} are gone from the replay buffer")
            if source.expected is not None and seq < source.expected:
                continue
            self._apply(source, seq, payload)
            source.replayed += 1


def initial_mode(feh_negotiated: bool) -> tuple[str, str]:
    """How an engine's events key the index before anything is verified."""
    if feh_negotiated:
        return ENGINE_HASHES, "FEH negotiated: the engine's block hashes are the ones pyfront ships"
    return VERIFYING, f"re-hashing the engine's first blocks to see whether its hashes are pyfront's ({VERIFYING})"
