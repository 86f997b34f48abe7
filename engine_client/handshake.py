"""The handshake with external (headless) engines, front-end side: at start-up and for engines that come back.

Engines connect to the handshake ROUTER this process binds and say HELLO; we answer INIT with the
addresses of every front-end process's input and output sockets; each engine then registers on every
input socket and says READY here (docs/engine-protocol.md#handshake). The handshake socket only carries HELLO,
INIT and READY, so one process can run it for several front-end processes (`client_index`), which
collect their own registrations (see `EngineClient`).

The socket stays bound for the life of the front end (`HandshakeServer.serve_restarts`), because an engine
that dies and is started again repeats the whole handshake from HELLO, as a vLLM engine process does on
every start, and vLLM's own front end closes this socket after start-up, so such an engine never gets INIT
there (docs/engine-protocol.md#engines-that-come-back). After start-up:
- a HELLO from one of the ranks 0..data_parallel_size-1 gets INIT, whatever we know of that rank: a second
  HELLO from a rank that still looks healthy is a restart too (an engine process says HELLO once, so the
  old process is gone or going); the engine then registers again on each front-end process's input socket,
  and each `EngineClient` re-admits it there;
- a HELLO from any other rank is refused (no INIT, a warning naming it): the deployment's size is fixed at
  start-up, every front-end process balances over exactly those ranks, and a stray engine (a wrong
  --data-parallel-rank, another deployment's engine on the same port) must not take traffic;
- nothing a peer sends raises: malformed or unexpected messages are logged and dropped, since one bad
  engine must not take down a front end that serves through the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio

from pyfront.engine_client import codec
from pyfront.engine_client.protocol import (
    EngineHandshakeMessage,
    EngineHandshakeMetadata,
    EngineZmqAddresses,
    engine_rank,
)

logger = logging.getLogger(__name__)


class HandshakeError(RuntimeError):
    """The engines did not complete the handshake (timeout, protocol violation)."""


def identity_rank(identity: bytes) -> int | None:
    """The rank behind a ZMQ identity, or None if it is not an engine's 2-byte identity."""
    try:
        return engine_rank(identity)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class ClientAddresses:
    """The sockets of one front-end process, as the engines connect to them."""

    input_address: str
    output_address: str


def handshake_address(host: str, port: int) -> str:
    """The handshake socket's ZMQ address for `--data-parallel-address` and `--data-parallel-rpc-port`."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def init_metadata(clients: Sequence[ClientAddresses]) -> EngineHandshakeMetadata:
    """INIT for a dense deployment without a coordinator: `parallel_config` stays empty, as in vllm-rs.

    vLLM fills `parallel_config` only for coordinated (MoE) DP, which pyfront does not drive.
    """
    return EngineHandshakeMetadata(
        EngineZmqAddresses([c.input_address for c in clients], [c.output_address for c in clients])
    )


class HandshakeServer:
    """The handshake ROUTER for engines of ranks 0..data_parallel_size-1: `startup()`, then `serve_restarts()`.

    ROUTER_HANDOVER lets a restarted engine's connection take over its rank's identity even while the old
    connection is still known (a peer that vanished without a FIN); vLLM 0.32 sets it on its input ROUTER
    for the same reason when elastic EP re-adds a rank (`core_client.py` `MPClient.__init__`).
    """

    def __init__(self, address: str, data_parallel_size: int, ctx: zmq.asyncio.Context | None = None) -> None:
        """Bind `address` at once (raises HandshakeError if it cannot), so engines may connect before `startup()`.

        An engine that connects early says HELLO, and the HELLO waits in the socket's queue until `startup()`
        reads it. That is why `pyfront serve` binds before it imports the app and loads the tokenizer
        (`server.launcher.run_server`): ZMQ retries a refused connect only every 100-200 ms, so an engine that
        waits for a front end not bound yet gets in up to 200 ms after the bind. With no `ctx` the server makes
        its own context, which `close()` ends.
        """
        self.address = address
        self.data_parallel_size = data_parallel_size
        self._init = b""
        """INIT, encoded once `startup()` knows the front-end processes' addresses."""
        self._expected = set(range(data_parallel_size))
        self._restarting: set[int] = set()
        """Ranks that said HELLO after start-up and have not said READY yet."""
        self._own_ctx = ctx is None
        self._ctx = zmq.asyncio.Context() if ctx is None else ctx
        self._socket = self._ctx.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            self._socket.bind(address)
        except zmq.ZMQError as exc:
            self.close()
            why = zmq.strerror(exc.errno) if exc.errno is not None else str(exc)  # pyzmq's str() repeats the address
            raise HandshakeError(f"cannot bind the handshake socket {address}: {why}") from None

    def close(self) -> None:
        """Close the socket (and the context, if it is the server's own); a second call does nothing."""
        if self._socket.closed:
            return
        self._socket.close(linger=0)
        if self._own_ctx:
            self._ctx.term()

    async def startup(self, clients: Sequence[ClientAddresses], timeout_s: float) -> dict[int, EngineHandshakeMessage]:
        """Admit every rank once, sending INIT with the sockets of `clients`; return each rank's READY message.

        Raises HandshakeError naming the ranks that never said HELLO or READY within `timeout_s`, or on a
        protocol violation (unexpected rank, READY before INIT, an engine that claims to be local): at
        start-up nothing serves yet, so failing loudly beats serving a deployment that is not the one asked for.
        """
        self._init = codec.encode_init(init_metadata(clients))
        socket = self._socket
        size = self.data_parallel_size
        expected = self._expected
        helloed: set[int] = set()
        ready: dict[int, EngineHandshakeMessage] = {}
        deadline = time.monotonic() + timeout_s
        logger.info("waiting for %d engine(s) to connect to %s", size, self.address)
        while len(ready) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await socket.poll(timeout=remaining * 1000):
                missing_hello = sorted(expected - helloed)
                missing_ready = sorted(expected - set(ready) - set(missing_hello))
                raise HandshakeError(
                    f"engine handshake timed out after {timeout_s:g}s on {self.address}: "
                    + "; ".join(
                        part
                        for part in (
                            f"ranks {missing_hello} never said HELLO" if missing_hello else "",
                            f"ranks {missing_ready} said HELLO but never READY" if missing_ready else "",
                        )
                        if part
                    )
                )
            frames = await socket.recv_multipart()
            if len(frames) != 2:
                raise HandshakeError(f"handshake message with {len(frames)} frames, expected identity + map")
            identity, payload = frames
            rank = identity_rank(identity)
            if rank not in expected:
                raise HandshakeError(
                    f"message from an engine with unexpected data parallel rank {identity.hex()} "
                    f"(expected ranks 0..{size - 1})"
                )
            try:
                message = codec.decode_handshake(payload)
            except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
                raise HandshakeError(f"malformed handshake message from rank {rank}: {exc}") from None
            status = message.status
            if message.local:
                raise HandshakeError(f"rank {rank} says it is local; pyfront only drives external engines")
            if status == "HELLO":
                if rank in helloed:
                    raise HandshakeError(f"rank {rank} said HELLO twice")
                helloed.add(rank)
                await socket.send_multipart([identity, self._init])
                logger.info("engine rank %d said HELLO; sent INIT", rank)
            elif status == "READY":
                if rank not in helloed:
                    raise HandshakeError(f"rank {rank} said READY before HELLO")
                if rank in ready:
                    raise HandshakeError(f"rank {rank} said READY twice")
                ready[rank] = message
                logger.info("engine rank %d is READY", rank)
            else:
                raise HandshakeError(f"unexpected handshake status {status!r} from rank {rank}")
        return ready

    async def serve_restarts(self) -> None:
        """After start-up, until cancelled: answer the HELLO of a restarted engine with INIT (see the module doc)."""
        assert self._init, "serve_restarts() runs after startup()"
        while True:
            await self._handle_after_startup(await self._socket.recv_multipart())

    async def _handle_after_startup(self, frames: list[bytes]) -> None:
        """One message after start-up: INIT for a known rank's HELLO; anything else is logged, never raised."""
        if len(frames) != 2:
            logger.warning("dropping a handshake message with %d frames (expected identity + map)", len(frames))
            return
        identity, payload = frames
        rank = identity_rank(identity)
        if rank not in self._expected:
            logger.warning(
                "refusing an engine with data parallel rank %s (identity %s) on %s: this front end serves "
                "ranks 0..%d, fixed at start-up; no INIT sent",
                rank if rank is not None else "?",
                identity.hex(),
                self.address,
                self.data_parallel_size - 1,
            )
            return
        try:
            message = codec.decode_handshake(payload)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            logger.warning("dropping a malformed handshake message from rank %d: %s", rank, exc)
            return
        if message.local:
            logger.warning("refusing rank %d: it says it is local; pyfront only drives external engines", rank)
            return
        if message.status == "HELLO":
            self._restarting.add(rank)
            # ROUTER without ROUTER_MANDATORY: if the engine vanished meanwhile, INIT is dropped, never blocks.
            await self._socket.send_multipart([identity, self._init])
            logger.warning(
                "engine rank %d said HELLO after start-up: a restarted engine (its predecessor is gone or "
                "going); sent INIT, it registers again with every front-end process",
                rank,
            )
        elif message.status == "READY":
            if rank in self._restarting:
                self._restarting.discard(rank)
                logger.info("restarted engine rank %d is READY", rank)
            else:
                logger.warning("ignoring READY from engine rank %d without a HELLO since start-up", rank)
        else:
            logger.warning("ignoring handshake status %r from engine rank %d", message.status, rank)
