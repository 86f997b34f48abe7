"""ZMTP 3.1 with the NULL mechanism, on the event loop: the engine input ROUTER and output PULL without libzmq.

Why: libzmq moves every message through its own I/O thread. A send queues the message on a pipe and wakes the
I/O thread, which writes it; a received message is read by the I/O thread, queued, and signalled to the reader
through a mailbox (an eventfd, `getpid` fork checks, `poll`). Measured on the 2-core VM, the front end on one
core, a 300-byte request and its answer through pyzmq the way `libzmq.py` drives it cost 80-120 us of CPU and
135-190 us of wall time; the same bytes over a plain asyncio socket cost 28-32 us and 60-80 us. A short chat
request is one such round trip, so that difference was ~15 % of pyfront's CPU per short request and ~10 % of its
latency. Here the engine connections are asyncio transports: a request is written straight from the event loop
(one `write`), and an output batch is parsed in the loop's read callback.

What is implemented is what the engines' libzmq (DEALER and PUSH sockets connecting to us) needs from a server,
per rfc.zeromq.org/spec/23 (ZMTP 3.0) and /37 (3.1):
- the greeting: signature, version 3.1, mechanism NULL, as-server 0 (NULL has no server role);
- the NULL handshake: one READY command each way with the Socket-Type property (and the peer's Identity);
- message frames (MORE / LONG bits) and command frames; PING is answered with PONG (libzmq sends PINGs only when
  a heartbeat interval is set, which vLLM does not do), other commands are ignored, ERROR closes the connection;
- ROUTER semantics as libzmq's ROUTER with ROUTER_MANDATORY and ROUTER_HANDOVER, which is how `libzmq.py`
  configures it: a received message is prefixed with its peer's identity (the peer's Identity property, or a
  generated one), a send to an identity without a connection fails at once (`EngineUnreachable`), and a new
  connection with a known identity takes it over;
- PULL semantics: messages from every connection, each connection's in order, none dropped (RCVHWM 0).

`transport/__init__.py` checks this module against the installed libzmq at start-up and falls back to
`libzmq.py` (with the reason logged) for addresses it does not take (inproc, abstract or wildcard ipc, host
names) or when the check fails.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import cast

from pyfront.engine_client.codec import Buffer
from pyfront.engine_client.transport.base import (
    OUTPUT_BATCH_MESSAGES,
    OUTPUT_BATCH_SECONDS,
    DisconnectHandler,
    EngineUnreachable,
    OutputHandler,
)

logger = logging.getLogger(__name__)

SIGNATURE = b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f"
"""The ZMTP 3 signature with the padding libzmq sends (a ZMTP 1.0 length of 1: readable by 1.0 peers as such)."""
GREETING = SIGNATURE + b"\x03\x01" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
"""Our whole greeting (64 bytes): version 3.1, mechanism NULL, as-server 0, filler."""
GREETING_SIZE = 64

FLAG_MORE = 0x01
FLAG_LONG = 0x02
FLAG_COMMAND = 0x04

SHORT_MAX = 255
JOIN_MAX = 65536
"""Messages up to this size are joined into one buffer and written with one `write`; larger ones go as a list of
buffers (`writelines`), so that a long prompt's ids are not copied once more."""

GENERATED_IDENTITY_PREFIX = b"\x00"
"""libzmq's ROUTER names a peer without an Identity property 0x00 + a 4-byte counter; so do we."""


class ZmtpError(Exception):
    """The peer broke the protocol, or is not a ZMTP 3 peer of a socket type we accept: its connection is closed."""


# ---------------------------------------------------------------------------------------------- the wire


def frame_header(flags: int, size: int) -> bytes:
    """A frame's flags and size: 2 bytes up to 255 bytes of body, else 9 (LONG, 64-bit big-endian size)."""
    if size <= SHORT_MAX:
        return bytes((flags, size))
    return bytes((flags | FLAG_LONG,)) + size.to_bytes(8, "big")


def command(name: bytes, data: bytes) -> bytes:
    """A whole command frame: the name's length and name, then the command's data."""
    body = bytes((len(name),)) + name + data
    return frame_header(FLAG_COMMAND, len(body)) + body


def ready(socket_type: bytes) -> bytes:
    """Our READY, byte for byte libzmq's for the same socket: Socket-Type, and for a ROUTER an empty Identity
    (libzmq sends its routing id, unset here, on REQ, DEALER and ROUTER sockets; only a ROUTER peer reads it)."""
    properties = b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type
    if socket_type == b"ROUTER":
        properties += b"\x08Identity\x00\x00\x00\x00"
    return command(b"READY", properties)


def parse_properties(data: bytes) -> dict[bytes, bytes]:
    """READY's metadata: (1-byte name length, name, 4-byte value length, value)*, names case-insensitive."""
    out: dict[bytes, bytes] = {}
    pos, end = 0, len(data)
    while pos < end:
        size = data[pos]
        name = data[pos + 1 : pos + 1 + size]
        pos += 1 + size
        if pos + 4 > end:
            raise ZmtpError("READY metadata truncated")
        length = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        if pos + length > end or len(name) != size:
            raise ZmtpError("READY metadata truncated")
        out[name.lower()] = data[pos : pos + length]
        pos += length
    return out


def check_greeting(greeting: bytes) -> None:
    """The peer's 64-byte greeting: a ZMTP 3.x peer with the NULL mechanism, or `ZmtpError`."""
    if greeting[0] != 0xFF or greeting[9] != 0x7F:
        raise ZmtpError("not a ZMTP 3 peer (bad signature)")
    if greeting[10] < 3:
        raise ZmtpError(f"ZMTP version {greeting[10]}.{greeting[11]} is not supported (3.x is)")
    mechanism = greeting[12:32].rstrip(b"\x00")
    if mechanism != b"NULL":
        raise ZmtpError(f"security mechanism {mechanism!r} is not supported (NULL is)")


def encode_message(frames: Sequence[Buffer], out: list[Buffer]) -> int:
    """Append the headers and bodies of a message's frames (MORE on all but the last) to `out`; returns a bound
    of their size on the wire (9 bytes of header counted per frame)."""
    total = 0
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        size = len(frame) if type(frame) is bytes or type(frame) is bytearray else memoryview(frame).nbytes
        out.append(frame_header(FLAG_MORE if i < last else 0, size))
        out.append(frame)
        total += size + 9
    return total


# ---------------------------------------------------------------------------------------------- one connection


class _Connection(asyncio.Protocol):
    """One peer: the greeting, the NULL handshake, then frames into messages for its socket.

    Incoming bytes are parsed where they arrive. Nothing is parsed until a whole frame is there (`_need`), so a
    large frame arriving in many reads is joined once, not once per read.
    """

    def __init__(self, socket: _ServerSocket) -> None:
        self.socket = socket
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.identity = b""
        self.ready = False
        self.closed = False
        self._greeted = False
        self._buf = bytearray()
        self._need = GREETING_SIZE
        self._parts: list[bytes] = []
        self._pending: list[Buffer] = []
        self._pending_bytes = 0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self._loop = asyncio.get_running_loop()  # once: on Python 3.11 each lookup is a getpid() system call
        self.peer = _describe_peer(transport)
        self.transport.write(GREETING)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.socket.lost(self)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return
            data = bytes(buf)
            buf.clear()
        elif len(data) < self._need:
            buf += data
            return
        try:
            pos = self._parse(data)
        except ZmtpError as exc:
            self.socket.read_done()
            self.abort(str(exc))
            return
        if pos < len(data):
            buf += memoryview(data)[pos:]
        self.socket.read_done()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # the protocol

    def abort(self, why: str) -> None:
        logger.warning("closing the engine connection from %s on %s: %s", self.peer, self.socket.endpoint, why)
        if self.transport is not None:
            self.transport.close()

    def write(self, frames: Sequence[Buffer], *, at_once: bool = False) -> None:
        """Queue one message: what a turn of the event loop queues goes out at its end, in one `write` (`flush`).

        A burst of requests (64 connections admitting at once) is then one system call per turn, as libzmq's I/O
        thread batched them, not one per request.

        `at_once` (a request to an engine with nothing else in flight: there is nothing to batch it with) writes
        the message now, unless messages are already queued (they go first, so it waits with them). The engine
        then starts on it while the handler finishes the work it does after sending and before it waits (the
        text streams, the metrics): measured on the sequential row of benchmarks/peers.py, the flush's turn and
        that work took ~25 us of each request's latency.
        """
        if at_once and not self._pending:
            self._pending_bytes = encode_message(frames, self._pending)
            self.flush()
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending_bytes += encode_message(frames, self._pending)

    def flush(self) -> None:
        """Write what is queued: joined into one buffer when small, else as a list (no copy of a long prompt)."""
        pending, total = self._pending, self._pending_bytes
        if not pending:
            return
        self._pending, self._pending_bytes = [], 0
        if self.transport is None or self.closed:
            return
        if total <= JOIN_MAX:
            self.transport.write(b"".join(pending))
        else:
            self.transport.writelines(pending)

    def _parse(self, data: bytes) -> int:
        """Consume every whole frame in `data`; returns where the first incomplete one starts."""
        pos, end = 0, len(data)
        if not self._greeted:
            check_greeting(data[:GREETING_SIZE])
            self._greeted = True
            pos = GREETING_SIZE
            assert self.transport is not None
            self.transport.write(ready(self.socket.socket_type))
        parts = self._parts
        deliver = self.socket.deliver
        while pos < end:
            flags = data[pos]
            if flags & FLAG_LONG:
                if pos + 9 > end:
                    self._need = 9
                    return pos
                size = int.from_bytes(data[pos + 1 : pos + 9], "big")
                start = pos + 9
            else:
                if pos + 2 > end:
                    self._need = 2
                    return pos
                size = data[pos + 1]
                start = pos + 2
            stop = start + size
            if stop > end:
                self._need = stop - pos
                return pos
            body = data[start:stop]
            pos = stop
            if flags & FLAG_COMMAND:
                self._command(body)
            elif not self.ready:
                raise ZmtpError("a message frame before the handshake's READY")
            elif flags & FLAG_MORE:
                parts.append(body)
            else:
                parts.append(body)
                self._parts = []
                deliver(self, parts)
                parts = self._parts
        self._need = 1
        return pos

    def _command(self, body: bytes) -> None:
        if not body or len(body) < 1 + body[0]:
            raise ZmtpError("malformed command frame")
        name = body[1 : 1 + body[0]]
        data = body[1 + body[0] :]
        if name == b"READY":
            if self.ready:
                raise ZmtpError("a second READY")
            properties = parse_properties(data)
            peer_type = properties.get(b"socket-type", b"")
            if peer_type not in self.socket.peer_types:
                raise ZmtpError(
                    f"a {peer_type.decode(errors='replace') or 'nameless'} socket cannot talk to our "
                    f"{self.socket.socket_type.decode()} (expected {b' or '.join(self.socket.peer_types).decode()})"
                )
            self.identity = properties.get(b"identity", b"")
            self.ready = True
            self.socket.admitted(self)
        elif name == b"PING":
            assert self.transport is not None
            self.transport.write(command(b"PONG", data[2:]))  # the context after the 2-byte TTL, echoed
        elif name == b"ERROR":
            reason = data[1 : 1 + data[0]].decode(errors="replace") if data else ""
            raise ZmtpError(f"the peer sent ERROR {reason!r}")
        # PONG and commands for other socket types (SUBSCRIBE, CANCEL, ...) mean nothing to ROUTER or PULL.


def _describe_peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "a local process"


# ---------------------------------------------------------------------------------------------- the sockets


class _ServerSocket:
    """A bound socket: its listener, its connections, and what a connection's messages become."""

    socket_type = b""
    peer_types: tuple[bytes, ...] = ()

    def __init__(self) -> None:
        self.server: asyncio.AbstractServer | None = None
        self.endpoint = ""
        self.connections: set[_Connection] = set()
        self._path: str | None = None
        self.closed = False
        """Closed by us: the connections it closes are not engines going away (nothing is reported)."""

    async def bind(self, address: str) -> str:
        """Listen on a `tcp://IP:PORT` (IP may be `*`) or `ipc://PATH` address; returns the bound endpoint."""
        loop = asyncio.get_running_loop()
        kind, host, port, path = parse_address(address)
        if kind == "ipc":
            assert path is not None
            self.server = await loop.create_unix_server(lambda: _Connection(self), path)
            self._path = path
            self.endpoint = f"ipc://{path}"
        else:
            self.server = await loop.create_server(lambda: _Connection(self), host, port, reuse_address=True)
            sockname = self.server.sockets[0].getsockname()
            shown = f"[{sockname[0]}]" if ":" in sockname[0] else sockname[0]
            self.endpoint = f"tcp://{shown}:{sockname[1]}"
        return self.endpoint

    def deliver(self, connection: _Connection, parts: list[bytes]) -> None:
        raise NotImplementedError

    def read_done(self) -> None:
        """The end of one read's messages."""

    def admitted(self, connection: _Connection) -> None:
        self.connections.add(connection)

    def lost(self, connection: _Connection) -> None:
        self.connections.discard(connection)

    def close(self) -> None:
        self.closed = True
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection.flush()  # e.g. the ABORTs a closing client just sent
            if connection.transport is not None:
                connection.transport.close()
        self.connections.clear()
        if self._path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._path)


class RouterSocket(_ServerSocket):
    """The engines' input: DEALERs connect, each known by its identity; messages arrive as `[identity, *frames]`."""

    socket_type = b"ROUTER"
    peer_types = (b"DEALER", b"REQ", b"ROUTER")

    def __init__(self, on_disconnect: Callable[[str], None]) -> None:
        super().__init__()
        self.on_disconnect = on_disconnect
        self.routes: dict[bytes, _Connection] = {}
        self.received: asyncio.Queue[list[bytes]] = asyncio.Queue()
        self._counter = itertools.count(0x6B8B4567)  # libzmq starts its generated ids at a random number

    def admitted(self, connection: _Connection) -> None:
        super().admitted(connection)
        if not connection.identity:
            connection.identity = GENERATED_IDENTITY_PREFIX + (next(self._counter) & 0xFFFFFFFF).to_bytes(4, "big")
        old = self.routes.get(connection.identity)
        self.routes[connection.identity] = connection
        if old is not None and old is not connection:  # ROUTER_HANDOVER: the newest connection owns the identity
            old.abort(f"identity {connection.identity.hex()} was taken over by {connection.peer}")

    def lost(self, connection: _Connection) -> None:
        super().lost(connection)
        if connection.ready and self.routes.get(connection.identity) is connection:
            del self.routes[connection.identity]
        if connection.ready and not self.closed:
            self.on_disconnect(self.endpoint)

    def deliver(self, connection: _Connection, parts: list[bytes]) -> None:
        parts.insert(0, connection.identity)
        self.received.put_nowait(parts)

    def send(self, identity: bytes, frames: Sequence[Buffer], *, at_once: bool = False) -> None:
        """Write one message to the connection with `identity`; `EngineUnreachable` if there is none."""
        connection = self.routes.get(identity)
        if connection is None or connection.closed:
            raise EngineUnreachable(identity)
        connection.write(frames, at_once=at_once)


class PullSocket(_ServerSocket):
    """The engines' output: PUSHes connect; every message goes to `on_message`, in bounded batches.

    Messages are routed from the read callback, as they are parsed. One read of many small messages (a busy
    engine, or a backlog after a stall) routes `OUTPUT_BATCH_MESSAGES` or for `OUTPUT_BATCH_SECONDS`, whichever
    comes first; the rest wait in a queue, every connection stops reading, and the loop runs its other callbacks
    before each next batch: an engine that outputs faster than we route must not starve `/health`, disconnects
    or signal handlers.
    """

    socket_type = b"PULL"
    peer_types = (b"PUSH",)

    def __init__(self, on_message: Callable[[list[bytes]], None]) -> None:
        super().__init__()
        self.on_message = on_message
        self._backlog: collections.deque[list[bytes]] | None = None
        """Messages waiting for a later turn of the loop; None while routing goes straight through."""
        self._routed = 0
        self._budget_end = 0.0

    def deliver(self, connection: _Connection, parts: list[bytes]) -> None:
        if self._backlog is not None:
            self._backlog.append(parts)
            return
        if not self._routed:
            self._budget_end = time.monotonic() + OUTPUT_BATCH_SECONDS
        self._routed += 1
        self._route(parts)
        if self._routed >= OUTPUT_BATCH_MESSAGES or time.monotonic() >= self._budget_end:
            self._backlog = collections.deque()
            for each in self.connections:
                each.pause_reading()
            asyncio.get_running_loop().call_soon(self._drain)

    def read_done(self) -> None:
        if self._backlog is None:
            self._routed = 0

    def _route(self, parts: list[bytes]) -> None:
        try:
            self.on_message(parts)
        except Exception:  # one bad message must not stop the outputs of every other request
            logger.exception("routing an engine output failed")

    def _drain(self) -> None:
        """Route a batch of the backlog; another turn if more waits, else read again."""
        backlog = self._backlog
        assert backlog is not None
        budget_end = time.monotonic() + OUTPUT_BATCH_SECONDS
        for _ in range(OUTPUT_BATCH_MESSAGES):
            if not backlog:
                break
            self._route(backlog.popleft())
            if time.monotonic() >= budget_end:
                break
        if backlog:
            asyncio.get_running_loop().call_soon(self._drain)
            return
        self._backlog = None
        self._routed = 0
        for each in self.connections:
            each.resume_reading()


def parse_address(address: str) -> tuple[str, str | None, int, str | None]:
    """`(kind, host, port, path)` of an address this module binds; `ValueError` (with why) for the others."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        raise ValueError(f"{address!r} has no transport")
    if scheme == "ipc":
        if not rest or rest.startswith("@") or rest == "*":
            raise ValueError(f"{address!r}: abstract or wildcard ipc names are left to libzmq")
        return "ipc", None, 0, rest
    if scheme != "tcp":
        raise ValueError(f"{address!r}: the {scheme} transport is left to libzmq")
    host, sep, port_text = rest.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"{address!r}: tcp addresses with a port wildcard or a service name are left to libzmq")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "*":
        host = "0.0.0.0"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{address!r}: host and interface names are left to libzmq") from None
    return "tcp", host, int(port_text), None


class ZmtpSockets:
    """The input ROUTER and output PULL of `EngineSockets`, on the event loop (see the module docstring)."""

    def __init__(self, on_output: OutputHandler, on_disconnect: DisconnectHandler, kind: str) -> None:
        self.kind = kind
        self._router = RouterSocket(on_disconnect)
        self._pull = PullSocket(on_output)
        self.input_address = ""
        self.output_address = ""

    @classmethod
    async def open(
        cls,
        input_address: str,
        output_address: str,
        on_output: OutputHandler,
        on_disconnect: DisconnectHandler,
        kind: str,
    ) -> ZmtpSockets:
        sockets = cls(on_output, on_disconnect, kind)
        try:
            sockets.input_address = await sockets._router.bind(input_address)
            sockets.output_address = await sockets._pull.bind(output_address)
        except BaseException:
            await sockets.close()
            raise
        return sockets

    def send(self, identity: bytes, frames: Sequence[Buffer], *, at_once: bool = False) -> None:
        self._router.send(identity, frames, at_once=at_once)

    async def recv_input(self) -> list[bytes]:
        return await self._router.received.get()

    async def close(self) -> None:
        self._router.close()
        self._pull.close()
        await asyncio.sleep(0)  # the aborted transports' connection_lost callbacks
