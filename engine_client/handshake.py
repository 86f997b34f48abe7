"""The startup handshake with external (headless) engines, front-end side.

Engines connect to the handshake ROUTER this process binds and say HELLO; we answer INIT with the
addresses of every front-end process's input and output sockets; each engine then registers on every
input socket and says READY here (docs/engine-protocol.md#handshake). The handshake socket only carries HELLO,
INIT and READY, so one process can run it for several front-end processes (`client_index`), which
collect their own registrations (see `EngineClient`).
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


def init_metadata(clients: Sequence[ClientAddresses]) -> EngineHandshakeMetadata:
    """INIT for a dense deployment without a coordinator: `parallel_config` stays empty, as in vllm-rs.

    vLLM fills `parallel_config` only for coordinated (MoE) DP, which pyfront does not drive.
    """
    return EngineHandshakeMetadata(
        EngineZmqAddresses([c.input_address for c in clients], [c.output_address for c in clients])
    )


async def run_handshake(
    ctx: zmq.asyncio.Context,
    handshake_address: str,
    data_parallel_size: int,
    clients: Sequence[ClientAddresses],
    timeout_s: float,
) -> dict[int, EngineHandshakeMessage]:
    """Admit engines of ranks 0..data_parallel_size-1; return each rank's READY message.

    Raises HandshakeError naming the ranks that never said HELLO or READY within `timeout_s`, or on a
    protocol violation (unexpected rank, READY before INIT, an engine that claims to be local).
    """
    socket = ctx.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.bind(handshake_address)
    except zmq.ZMQError as exc:
        socket.close()
        raise HandshakeError(f"cannot bind the handshake socket {handshake_address}: {exc}") from None
    init = codec.encode_init(init_metadata(clients))
    expected = set(range(data_parallel_size))
    helloed: set[int] = set()
    ready: dict[int, EngineHandshakeMessage] = {}
    deadline = time.monotonic() + timeout_s
    logger.info("waiting for %d engine(s) to connect to %s", data_parallel_size, handshake_address)
    try:
        while len(ready) < data_parallel_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await socket.poll(timeout=remaining * 1000):
                missing_hello = sorted(expected - helloed)
                missing_ready = sorted(expected - set(ready) - set(missing_hello))
                raise HandshakeError(
                    f"engine handshake timed out after {timeout_s:g}s on {handshake_address}: "
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
                    f"(expected ranks 0..{data_parallel_size - 1})"
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
                await socket.send_multipart([identity, init])
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
    finally:
        socket.close(linger=0)
    return ready
