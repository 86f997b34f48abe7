"""What the engine client needs of a transport: the input ROUTER and the output PULL, however they are made.

Two implementations (`zmtp.py` on the event loop, `libzmq.py` through pyzmq) give the engines the same bytes;
`transport/__init__.py` picks one at start-up. Tests swap them the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from pyfront.engine_client.codec import Buffer

OUTPUT_BATCH_MESSAGES = 64
"""At most this many output messages are routed before the event loop gets a turn."""
OUTPUT_BATCH_SECONDS = 0.004
"""... or for at most this long (a message routed to many streams costs more than one routed to one)."""


class EngineUnreachable(Exception):
    """No connection has this identity: the engine process is gone (libzmq's EHOSTUNREACH with ROUTER_MANDATORY)."""

    def __init__(self, identity: bytes) -> None:
        super().__init__(f"no engine connection has the identity {identity.hex()}")
        self.identity = identity


OutputHandler = Callable[[list[bytes]], None]
"""Takes each output message's frames, in the order each engine sent them, a bounded batch per loop turn."""
DisconnectHandler = Callable[[str], None]
"""Told the input socket's endpoint when an engine's connection to it drops."""


class EngineSockets(Protocol):
    """The input ROUTER (requests out, registrations in) and the output PULL (engine outputs in) of one client.

    Made bound and running by `transport.open_engine_sockets`: from then on outputs go to its `OutputHandler` and
    dropped engine connections to its `DisconnectHandler`.
    """

    input_address: str
    output_address: str
    kind: str
    """Which transport, and why it was chosen (logged, and shown by tests)."""

    def send(self, identity: bytes, frames: Sequence[Buffer], *, at_once: bool = False) -> None:
        """One message to the engine with `identity`, without blocking; `EngineUnreachable` if it is gone.

        `at_once`: the caller knows that nothing will be batched with it (the engine has nothing else of ours in
        flight), so a transport that gathers a turn's messages into one write sends this one now.
        """

    async def recv_input(self) -> list[bytes]:
        """The next message on the input ROUTER (only registrations arrive there): `[identity, *frames]`."""

    async def close(self) -> None:
        """Stop, close the connections and the listeners."""
