"""engine_client/transport/zmtp.py against the installed libzmq (the engines' side is libzmq, through pyzmq as in
vLLM), and byte by byte against fixed frames: greeting, READY, message and command frames, any split of the
stream, ROUTER routing, handover and disconnects, PULL fairness, and peers that are not engines."""

from __future__ import annotations

import asyncio
import glob
import os
import random
import socket
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop
import zmq
import zmq.asyncio

from pyfront.engine_client.transport import (
    EngineUnreachable,
    check_against_libzmq,
    open_engine_sockets,
    transport_choice,
)
from pyfront.engine_client.transport.zmtp import (
    GREETING,
    PullSocket,
    RouterSocket,
    ZmtpSockets,
    _Connection,
    command,
    encode_message,
    frame_header,
    parse_address,
    ready,
)


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def event_loop_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test on asyncio's own loop and on uvloop's (what `pyfront serve` runs), whose transports differ."""
    if request.param == "uvloop":
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        yield request.param
    finally:
        asyncio.set_event_loop_policy(None)


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 30))


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


class Opened:
    """Native sockets on ipc (or tcp) with what they received and the disconnects they reported."""

    def __init__(self) -> None:
        self.outputs: list[list[bytes]] = []
        self.disconnects: list[str] = []
        self.sockets: ZmtpSockets | None = None

    async def open(self, input_address: str, output_address: str) -> ZmtpSockets:
        self.sockets = await ZmtpSockets.open(
            input_address, output_address, self.outputs.append, self.disconnects.append, "test"
        )
        return self.sockets


# ---------------------------------------------------------------- the wire, byte by byte


def test_fixed_frames() -> None:
    expected = b"\xff" + bytes(7) + b"\x01\x7f" + b"\x03\x01" + b"NULL" + bytes(16) + b"\x00" + bytes(31)
    assert expected == GREETING
    assert len(GREETING) == 64
    assert ready(b"ROUTER") == b"\x04\x29\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER\x08Identity\x00\x00\x00\x00"
    assert ready(b"PULL") == b"\x04\x1a\x05READY\x0bSocket-Type\x00\x00\x00\x04PULL"
    assert frame_header(0, 0) == b"\x00\x00"
    assert frame_header(1, 255) == b"\x01\xff"
    assert frame_header(0, 256) == b"\x02" + (256).to_bytes(8, "big")
    assert frame_header(1, 70000) == b"\x03" + (70000).to_bytes(8, "big")
    assert command(b"PONG", b"ctx") == b"\x04\x08\x04PONGctx"
    pieces: list[Any] = []
    encode_message([b"a", bytearray(b"bc"), memoryview(b"def")], pieces)
    assert b"".join(bytes(p) for p in pieces) == b"\x01\x01a\x01\x02bc\x00\x03def"


def test_addresses() -> None:
    assert parse_address("tcp://127.0.0.1:0") == ("tcp", "127.0.0.1", 0, None)
    assert parse_address("tcp://*:5555") == ("tcp", "0.0.0.0", 5555, None)
    assert parse_address("tcp://[::1]:7") == ("tcp", "::1", 7, None)
    assert parse_address("ipc:///tmp/x-in") == ("ipc", None, 0, "/tmp/x-in")
    for address in ("inproc://x", "ipc://@abstract", "ipc://*", "tcp://eth0:5555", "tcp://127.0.0.1:*", "x"):
        with pytest.raises(ValueError):
            parse_address(address)


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: Any) -> None:
        self.written += data

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


def peer_stream(messages: list[list[bytes]], identity: bytes = b"\x01\x00") -> bytes:
    """What a libzmq DEALER writes: greeting, READY with its identity, a PING, then `messages`."""
    properties = b"\x0bSocket-Type\x00\x00\x00\x06DEALER"
    properties += b"\x08Identity" + len(identity).to_bytes(4, "big") + identity
    out = bytearray(GREETING[:10] + b"\x03\x01" + GREETING[12:])
    out += command(b"READY", properties)
    out += command(b"PING", b"\x00\x0aping-ctx")
    for message in messages:
        pieces: list[Any] = []
        encode_message(message, pieces)
        out += b"".join(bytes(p) for p in pieces)
    return bytes(out)


@pytest.mark.parametrize("seed", range(12))
def test_any_split_of_the_stream_parses_the_same(seed: int) -> None:
    """However the bytes arrive (one at a time, large chunks, a frame across many reads), the same messages."""
    rng = random.Random(seed)
    messages = [
        [os.urandom(rng.choice((0, 1, 7, 255, 256, 3000, 70000))) for _ in range(rng.randint(1, 4))]
        for _ in range(rng.randint(1, 12))
    ]
    stream = peer_stream(messages)

    async def main() -> None:
        router = RouterSocket(lambda _: None)
        connection = _Connection(router)
        transport = FakeTransport()
        connection.connection_made(transport)
        pos = 0
        while pos < len(stream):
            step = rng.choice((1, 2, 9, 64, 100, 5000, 100000))
            connection.data_received(stream[pos : pos + step])
            pos += step
        assert not transport.closed
        received = []
        while not router.received.empty():
            received.append(router.received.get_nowait())
        assert received == [[b"\x01\x00", *m] for m in messages]
        # ours: greeting, READY (after the peer's greeting), and a PONG echoing the PING's context
        assert bytes(transport.written) == GREETING + ready(b"ROUTER") + command(b"PONG", b"ping-ctx")

    asyncio.run(main())


@pytest.mark.parametrize(
    ("stream", "why"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64), "not a ZMTP 3 peer"),
        (GREETING[:10] + b"\x02\x00" + bytes(52), "version 2.0"),
        (GREETING[:12] + b"PLAIN".ljust(20, b"\x00") + bytes(32), "PLAIN"),
        (GREETING + command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x03PUB"), "PUB socket cannot"),
        (GREETING + b"\x00\x01x", "before the handshake"),
        (GREETING + command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x09DEALER"), "truncated"),
        (GREETING + command(b"ERROR", b"\x04oops"), "ERROR 'oops'"),
    ],
)
def test_a_peer_that_is_not_an_engine_is_closed(stream: bytes, why: str, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        router = RouterSocket(lambda _: None)
        connection = _Connection(router)
        transport = FakeTransport()
        connection.connection_made(transport)
        connection.data_received(stream)
        assert transport.closed
        assert router.received.empty() and not router.routes

    asyncio.run(main())
    assert why in caplog.text


def test_a_turn_s_messages_go_out_in_one_write_and_close_flushes() -> None:
    class CountingTransport(FakeTransport):
        writes = 0

        def write(self, data: Any) -> None:
            self.writes += 1
            super().write(data)

    async def main() -> None:
        router = RouterSocket(lambda _: None)
        connection = _Connection(router)
        transport = CountingTransport()
        connection.connection_made(transport)
        connection.data_received(peer_stream([]))
        await asyncio.sleep(0)
        transport.written.clear()
        transport.writes = 0
        messages = [[b"\x00", os.urandom(n)] for n in (10, 300, 2000)]
        for message in messages:
            router.send(b"\x01\x00", message)
        assert transport.writes == 0  # queued until the end of this turn
        await asyncio.sleep(0)
        assert transport.writes == 1
        expected: list[Any] = []
        for message in messages:
            encode_message(message, expected)
        assert bytes(transport.written) == b"".join(bytes(p) for p in expected)
        big = os.urandom(100_000)  # above JOIN_MAX: written as a list, not copied into one buffer
        router.send(b"\x01\x00", [b"\x00", big])
        router.send(b"\x01\x00", [b"last"])
        router.close()  # flushes before it closes
        assert transport.closed
        assert bytes(transport.written).endswith(big + b"\x00\x04last")

    asyncio.run(main())


def test_at_once_writes_now_unless_messages_are_queued() -> None:
    """A request to an idle engine (`at_once`) is written in the call; behind queued messages it waits with them,
    so the order on the wire is the order of the sends."""

    class CountingTransport(FakeTransport):
        writes = 0

        def write(self, data: Any) -> None:
            self.writes += 1
            super().write(data)

    async def main() -> None:
        router = RouterSocket(lambda _: None)
        connection = _Connection(router)
        transport = CountingTransport()
        connection.connection_made(transport)
        connection.data_received(peer_stream([]))
        await asyncio.sleep(0)
        transport.written.clear()
        transport.writes = 0
        first, queued, behind = [b"\x00", b"first"], [b"\x00", b"queued"], [b"\x00", b"behind"]
        router.send(b"\x01\x00", first, at_once=True)
        assert transport.writes == 1
        router.send(b"\x01\x00", queued)
        router.send(b"\x01\x00", behind, at_once=True)
        assert transport.writes == 1  # behind a queued message: the turn's flush writes both
        await asyncio.sleep(0)
        assert transport.writes == 2
        expected: list[Any] = []
        for message in (first, queued, behind):
            encode_message(message, expected)
        assert bytes(transport.written) == b"".join(bytes(p) for p in expected)
        await asyncio.sleep(0)
        assert transport.writes == 2  # the first write left nothing queued behind it

    asyncio.run(main())


# ---------------------------------------------------------------- against libzmq


def handshake_bytes(port: int, peer_type: bytes) -> bytes:
    """What a server socket on `port` sends a raw client that greets and READYs as a `peer_type` socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(GREETING + command(b"READY", b"\x0bSocket-Type" + len(peer_type).to_bytes(4, "big") + peer_type))
        data = b""
        expected = len(GREETING) + len(ready(b"ROUTER" if peer_type == b"DEALER" else b"PULL"))
        while len(data) < expected:
            chunk = raw.recv(4096)
            if not chunk:
                break
            data += chunk
        return data


@pytest.mark.parametrize(
    ("ours", "theirs", "peer_type"), [("ROUTER", zmq.ROUTER, b"DEALER"), ("PULL", zmq.PULL, b"PUSH")]
)
def test_the_handshake_is_byte_for_byte_libzmq_s(ours: str, theirs: int, peer_type: bytes) -> None:
    """An engine's libzmq receives from us exactly the greeting and READY a libzmq socket of that type sends."""
    ctx = zmq.Context()
    sock = ctx.socket(theirs)
    try:
        libzmq_bytes = handshake_bytes(sock.bind_to_random_port("tcp://127.0.0.1"), peer_type)
    finally:
        sock.close(0)
        ctx.term()

    async def main() -> None:
        server = RouterSocket(lambda _: None) if ours == "ROUTER" else PullSocket(lambda _: None)
        endpoint = await server.bind("tcp://127.0.0.1:0")
        port = int(endpoint.rsplit(":", 1)[1])
        our_bytes = await asyncio.to_thread(handshake_bytes, port, peer_type)
        server.close()
        assert our_bytes == libzmq_bytes

    run(main)


def test_router_round_trips_with_libzmq_dealers(tmp_path: Path) -> None:
    """Identities route both ways; frames of every size class arrive intact; an unknown identity is refused."""

    async def main() -> None:
        opened = Opened()
        sockets = await opened.open(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
        ctx = zmq.asyncio.Context()
        dealers = {}
        for identity in (b"\x00\x00", b"\x01\x00"):
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.IDENTITY, identity)
            dealer.connect(sockets.input_address)
            dealers[identity] = dealer
            await dealer.send_multipart([b"", identity + b" registers"])
        got = [await sockets.recv_input() for _ in dealers]
        assert sorted(got) == sorted([[i, b"", i + b" registers"] for i in dealers])
        for identity, dealer in dealers.items():
            frames = [b"\x00", os.urandom(300), b"", os.urandom(1 << 20), identity]
            sockets.send(identity, frames)
            assert await dealer.recv_multipart() == frames
        with pytest.raises(EngineUnreachable):
            sockets.send(b"\x02\x00", [b"\x00", b"x"])
        for dealer in dealers.values():
            dealer.close(0)
        await until(lambda: len(opened.disconnects) == 2, "two disconnects")
        assert opened.disconnects == [sockets.input_address] * 2
        for identity in dealers:
            with pytest.raises(EngineUnreachable):
                sockets.send(identity, [b"\x00", b"x"])
        await sockets.close()
        ctx.term()

    run(main)


def test_closing_our_sockets_reports_no_engine_as_gone(tmp_path: Path) -> None:
    """Our own close (the client shutting down) closes the engines' connections: that is not an engine dropping,
    and reporting it made every orderly shutdown log `an engine connection ... dropped; probing`."""

    async def main() -> None:
        opened = Opened()
        sockets = await opened.open(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
        ctx = zmq.asyncio.Context()
        dealer = ctx.socket(zmq.DEALER)
        try:
            dealer.setsockopt(zmq.IDENTITY, b"\x00\x00")
            dealer.connect(sockets.input_address)
            await dealer.send_multipart([b"", b"registers"])
            assert await sockets.recv_input() == [b"\x00\x00", b"", b"registers"]
            await sockets.close()
            await asyncio.sleep(0.05)  # the transports' connection_lost callbacks have run
            assert opened.disconnects == []
        finally:
            dealer.close(0)
            ctx.term()

    run(main)


def test_a_new_connection_takes_an_identity_over(tmp_path: Path) -> None:
    """ROUTER_HANDOVER: a restarted engine's connection owns its rank's identity even before the old one drops."""

    async def main() -> None:
        opened = Opened()
        sockets = await opened.open(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
        ctx = zmq.asyncio.Context()
        old, new = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
        for dealer in (old, new):
            dealer.setsockopt(zmq.IDENTITY, b"\x00\x00")
            dealer.setsockopt(zmq.LINGER, 0)
        old.connect(sockets.input_address)
        await old.send_multipart([b"old"])
        assert await sockets.recv_input() == [b"\x00\x00", b"old"]
        new.connect(sockets.input_address)
        await new.send_multipart([b"new"])
        assert await sockets.recv_input() == [b"\x00\x00", b"new"]
        sockets.send(b"\x00\x00", [b"for the new one"])
        assert await new.recv_multipart() == [b"for the new one"]
        await until(lambda: len(opened.disconnects) == 1, "the old connection closed")
        sockets.send(b"\x00\x00", [b"still the new one"])  # the old one's loss does not remove the route
        assert await new.recv_multipart() == [b"still the new one"]
        assert not await old.poll(100)
        old.close(0)
        new.close(0)
        await sockets.close()
        ctx.term()

    run(main)


def test_a_dealer_without_identity_gets_one(tmp_path: Path) -> None:
    async def main() -> None:
        opened = Opened()
        sockets = await opened.open("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
        assert sockets.input_address.startswith("tcp://127.0.0.1:")
        ctx = zmq.asyncio.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(sockets.input_address)
        await dealer.send_multipart([b"hello"])
        identity, hello = await sockets.recv_input()
        assert hello == b"hello" and len(identity) == 5 and identity[0] == 0
        sockets.send(identity, [b"back"])
        assert await dealer.recv_multipart() == [b"back"]
        dealer.close(0)
        await sockets.close()
        ctx.term()

    run(main)


def test_pull_takes_every_push_in_order(tmp_path: Path) -> None:
    """Two engines push interleaved, small and 4 MB messages: every message once, each engine's in its order."""

    async def main() -> None:
        opened = Opened()
        sockets = await opened.open(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
        ctx = zmq.asyncio.Context()
        pushes = [ctx.socket(zmq.PUSH) for _ in range(2)]
        big = os.urandom(4 << 20)
        for push in pushes:
            push.connect(sockets.output_address)
        for i in range(500):
            for n, push in enumerate(pushes):
                await push.send_multipart([b"%d" % n, b"%d" % i, big if i % 100 == 7 else b"x" * (i % 300)])
        await until(lambda: len(opened.outputs) == 1000, "1000 outputs")
        for n in range(2):
            mine = [m for m in opened.outputs if m[0] == b"%d" % n]
            assert [int(m[1]) for m in mine] == list(range(500))
            assert all(m[2] == (big if i % 100 == 7 else b"x" * (i % 300)) for i, m in enumerate(mine))
        for push in pushes:
            push.close(0)
        await sockets.close()
        ctx.term()

    run(main)


def test_an_output_handler_that_raises_costs_only_that_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        seen: list[bytes] = []

        def handler(frames: list[bytes]) -> None:
            if frames[0] == b"bad":
                raise RuntimeError("boom")
            seen.append(frames[0])

        pull = PullSocket(handler)
        await pull.bind(f"ipc://{tmp_path}/out")
        ctx = zmq.asyncio.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(pull.endpoint)
        for frames in ([b"a"], [b"bad"], [b"b"]):
            await push.send_multipart(frames)
        await until(lambda: len(seen) == 2, "two outputs")
        assert seen == [b"a", b"b"]
        push.close(0)
        pull.close()
        ctx.term()

    run(main)
    assert "routing an engine output failed" in caplog.text


def test_a_raw_socket_speaking_http_is_closed_and_the_engines_go_on(tmp_path: Path) -> None:
    async def main() -> None:
        opened = Opened()
        sockets = await opened.open("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
        host, port = sockets.input_address[len("tcp://") :].rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64))
        assert (await reader.read(64)) == GREETING
        assert await reader.read() == b""  # closed by us
        writer.close()
        ctx = zmq.asyncio.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, b"\x00\x00")
        dealer.connect(sockets.input_address)
        await dealer.send_multipart([b"still fine"])
        assert await sockets.recv_input() == [b"\x00\x00", b"still fine"]
        assert opened.disconnects == []  # a peer that never finished the handshake is no engine
        dealer.close(0)
        await sockets.close()
        ctx.term()

    run(main)


# ---------------------------------------------------------------- choosing the transport


def test_the_choice_and_its_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert transport_choice({}) == "auto"
    assert transport_choice({"PYFRONT_ENGINE_TRANSPORT": " LIBZMQ "}) == "libzmq"
    with pytest.raises(ValueError, match="expected one of"):
        transport_choice({"PYFRONT_ENGINE_TRANSPORT": "rdma"})

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        assert await check_against_libzmq(ctx) is None
        assert await check_against_libzmq(ctx, "ipc") is None
        ipc = (f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
        inproc = ("inproc://a-in", "inproc://a-out")
        opened = [
            await open_engine_sockets(ctx, *ipc, lambda _: None, lambda _: None, "auto"),
            await open_engine_sockets(ctx, *inproc, lambda _: None, lambda _: None, "auto"),
        ]
        assert opened[0].kind.startswith("zmtp") and opened[0].input_address == ipc[0]
        assert opened[1].kind.startswith("libzmq") and "inproc transport is left to libzmq" in opened[1].kind
        for sockets in opened:
            await sockets.close()
        with pytest.raises(ValueError, match="zmtp, but"):
            await open_engine_sockets(ctx, *inproc, lambda _: None, lambda _: None, "zmtp")

        async def failing(_: zmq.asyncio.Context, kind: str) -> str:
            return "the start-up check got no answer"

        monkeypatch.setattr("pyfront.engine_client.transport.check_against_libzmq", failing)
        fallback = await open_engine_sockets(ctx, *ipc, lambda _: None, lambda _: None, "auto")
        assert fallback.kind == "libzmq (the start-up check got no answer)"
        await fallback.close()
        ctx.term()

    run(main)


def test_no_descriptor_is_left_behind(tmp_path: Path) -> None:
    """Opening and closing the native sockets (with the check) many times leaks neither sockets nor files."""

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        checks_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "pyfront-check-*")))
        for i in range(3):  # warm up: libzmq's own descriptors
            sockets = await open_engine_sockets(
                ctx, f"ipc://{tmp_path}/w{i}-in", f"ipc://{tmp_path}/w{i}-out", lambda _: None, lambda _: None
            )
            await sockets.close()
        before = len(os.listdir("/proc/self/fd"))
        for i in range(20):
            sockets = await open_engine_sockets(
                ctx, f"ipc://{tmp_path}/{i}-in", f"ipc://{tmp_path}/{i}-out", lambda _: None, lambda _: None
            )
            await sockets.close()
        await asyncio.sleep(0.1)
        assert len(os.listdir("/proc/self/fd")) <= before + 2
        assert os.listdir(tmp_path) == []  # the ipc paths are removed on close
        checks_after = set(glob.glob(os.path.join(tempfile.gettempdir(), "pyfront-check-*")))
        assert checks_after <= checks_before  # the ipc check's directory goes with it
        ctx.term()

    run(main)
