"""Bounds on reading a request (server/http_limits.py), over raw sockets against the app served as `pyfront serve`
serves it (launcher.build_uvicorn_config): header size and count (431), the time a request may take to arrive
(408, or a close), with /health answering throughout, and ordinary traffic (keep-alive, pipelining, large bodies,
large but allowed heads) untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from uvicorn.protocols.utils import get_local_addr, get_remote_addr
from uvicorn.server import ServerState

from pyfront.engine_client.mock_engine import MockConfig, MockEngine
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from pyfront.server.http_limits import ReadLimits, protocol_class
from pyfront.server.launcher import build_uvicorn_config
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.conftest import free_port
from tests.harness import API_KEY, MODEL

READ_TIMEOUT_S = 2.0
"""--request-read-timeout for these tests; every wait for it to fire allows several times as much."""
GENEROUS_S = READ_TIMEOUT_S + 15
KEEP_ALIVE_S = 1.0
"""uvicorn's timeout_keep_alive for these tests (its default is 5 s)."""
AUTH = f"Authorization: Bearer {API_KEY}\r\n".encode()


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    rpc_port, http_port = free_port(), free_port()
    mock = MockEngine(MockConfig(handshake_address=f"tcp://127.0.0.1:{rpc_port}", ranks=[0])).start()
    config = ServerConfig(
        model=BUNDLED_TOKENIZER_NAME,
        served_model_name=[MODEL],
        port=http_port,
        api_key=[API_KEY],
        data_parallel_rpc_port=rpc_port,
        uvicorn_log_level="warning",
        request_read_timeout=READ_TIMEOUT_S,
        max_request_body_bytes=4 * 1024 * 1024,
    )
    uvicorn_config = build_uvicorn_config(create_app(config), config)
    uvicorn_config.timeout_keep_alive = int(KEEP_ALIVE_S)
    server = uvicorn.Server(uvicorn_config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not _healthy(http_port):
            assert time.monotonic() < deadline, "the server did not become healthy"
            time.sleep(0.05)
        yield http_port
    finally:
        server.should_exit = True
        thread.join(10)
        mock.stop()


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Answer:
    status: int | None
    """None: the connection closed before a status line."""
    body: bytes
    closed: bool
    """The server closed the connection after the answer (end of file, or a reset)."""


def _read_answer(sock: socket.socket, *, then_closed: bool = True, buffer: bytearray | None = None) -> Answer:
    """One response (by Content-Length), then (`then_closed`) whether the server closes the connection.

    `buffer` holds what was read past the response (the next pipelined one): pass the same one for each answer
    of a connection.
    """
    sock.settimeout(GENEROUS_S)
    data = bytearray() if buffer is None else buffer
    try:
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                return Answer(None, bytes(data), True)
            data += piece
        end = data.index(b"\r\n\r\n")
        head = bytes(data[:end])
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        while len(data) < end + 4 + length:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
        body = bytes(data[end + 4 : end + 4 + length])
        del data[: end + 4 + length]
        status = int(head.split(b" ", 2)[1])
        closed = False
        if then_closed:
            with contextlib.suppress(TimeoutError):
                closed = sock.recv(1) == b""
        return Answer(status, body, closed)
    except ConnectionResetError:
        return Answer(None, bytes(data), True)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S)


def _error(answer: Answer) -> dict:
    error = json.loads(answer.body)["error"]
    assert error["code"] == answer.status
    return error


def test_a_huge_header_gets_431_without_a_key(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
        answer = _read_answer(sock)
    assert answer.status == 431 and answer.closed
    assert "65536-byte limit" in _error(answer)["message"]


def test_a_huge_url_gets_431(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET /v1/models?" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = _read_answer(sock)
    assert answer.status == 431 and answer.closed


def test_too_many_headers_get_431(port: int) -> None:
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(1000))
    with _connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        answer = _read_answer(sock)
    assert answer.status == 431 and answer.closed
    assert "more than 256 headers" in _error(answer)["message"]


def test_a_malformed_request_gets_400_in_the_api_shape(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        answer = _read_answer(sock)
    assert answer.status == 400 and answer.closed
    assert _error(answer)["message"].startswith("invalid HTTP request")


def test_garbage_after_a_request_is_refused_after_its_response(port: int) -> None:
    """The request before the garbage gets its whole answer first (not cut, not interleaved), then the 400."""
    with _connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\nNOT HTTP AT ALL\r\n\r\n")
        buffer = bytearray()
        first = _read_answer(sock, then_closed=False, buffer=buffer)
        second = _read_answer(sock, buffer=buffer)
    assert first.status == 200 and json.loads(first.body)["object"] == "list"
    assert second.status == 400 and second.closed and _error(second)["message"].startswith("invalid HTTP request")


def test_heads_and_bodies_within_the_limits_are_served(port: int) -> None:
    """A 60 KiB header and 200 headers are allowed; a 1 MiB body arriving with its head is not counted as head."""
    with _connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"X-Big: " + b"a" * 60_000 + b"\r\n\r\n")
        assert _read_answer(sock, then_closed=False).status == 200
        headers = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + headers + b"\r\n")
        assert _read_answer(sock, then_closed=False).status == 200
        body = json.dumps({"model": "no-such-model", "prompt": "a" * (1 << 20)}).encode()
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        assert _read_answer(sock, then_closed=False).status == 404


def test_keep_alive_and_pipelining_outlast_the_read_timeout(port: int) -> None:
    """The clock is per request: a connection that sends requests for longer than the timeout is not cut."""
    request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n"
    with _connect(port) as sock:
        started = time.monotonic()
        while time.monotonic() - started < READ_TIMEOUT_S * 1.5:
            sock.sendall(request)
            assert _read_answer(sock, then_closed=False).status == 200
            time.sleep(0.3)
        sock.sendall(request * 3)
        buffer = bytearray()
        assert [_read_answer(sock, then_closed=False, buffer=buffer).status for _ in range(3)] == [200] * 3


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(port: int) -> None:
    """uvicorn's keep-alive timeout, kept on the connection's one timer: a connection idle after its answer (a lane
    POST, answered by the direct exchange, or a GET) is closed after it, not at once; a request begun in the idle
    time is on the read clock from then on (a stalled one gets its 408 after the read timeout, not a close after
    the keep-alive timeout). That a connection sending requests every 0.3 s is kept: the test above."""
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    requests = [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: %d\r\n\r\n" % len(chat) + chat,
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n",
    ]
    for request in requests:
        with _connect(port) as sock:
            sock.sendall(request)
            assert _read_answer(sock, then_closed=False).status == 200
            answered = time.monotonic()
            sock.settimeout(GENEROUS_S)
            assert sock.recv(1) == b""
            assert KEEP_ALIVE_S * 0.8 <= time.monotonic() - answered < KEEP_ALIVE_S + 5
    with _connect(port) as sock:
        sock.sendall(requests[1])
        assert _read_answer(sock, then_closed=False).status == 200
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost:")
        begun = time.monotonic()
        answer = _read_answer(sock)
        assert answer.status == 408 and answer.closed
        assert time.monotonic() - begun >= READ_TIMEOUT_S * 0.8


class HealthProbe:
    """/health every 50 ms in a thread, for the duration of a `with`; every probe must answer 200."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: list[int | str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.answers.append(httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=5).status_code)
            except httpx.HTTPError as exc:
                self.answers.append(repr(exc))
            self.stop.wait(0.05)

    def __enter__(self) -> HealthProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def _slowloris(port: int) -> Answer:
    """A request head dribbled one header every 0.2 s, never ended."""
    with _connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        sock.settimeout(0.2)
        for i in range(int(GENEROUS_S / 0.2)):
            try:
                sock.sendall(b"X-%d: v\r\n" % i)
                if sock.recv(65536, socket.MSG_PEEK):
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        return _read_answer(sock)


def _short_body(port: int) -> Answer:
    """A Content-Length larger than the body sent."""
    with _connect(port) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"model": '
        )
        return _read_answer(sock)


def _endless_chunks(path: bytes, port: int) -> Answer:
    """A chunked body that never ends: a small chunk every 0.2 s."""
    with _connect(port) as sock:
        sock.sendall(
            b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b'2\r\n{"\r\n'
        )
        sock.settimeout(0.2)
        for _ in range(int(GENEROUS_S / 0.2)):
            try:
                sock.sendall(b"1\r\na\r\n")
                if sock.recv(65536, socket.MSG_PEEK):
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        return _read_answer(sock)


def _silent(port: int) -> Answer:
    """A connection that never sends anything."""
    with _connect(port) as sock:
        return _read_answer(sock)


def test_requests_that_never_finish_arriving_are_ended_after_the_timeout(port: int) -> None:
    """Slowloris, a short body, endless chunked bodies (fast lane and FastAPI route) and a silent connection, at
    once: each is answered 408 (the silent one just closed) once --request-read-timeout has passed, and /health
    answers throughout."""
    cases = {
        "slowloris": lambda: _slowloris(port),
        "short body": lambda: _short_body(port),
        "endless chunks, fast lane": lambda: _endless_chunks(b"/v1/chat/completions", port),
        "endless chunks, /tokenize": lambda: _endless_chunks(b"/tokenize", port),
        "silent": lambda: _silent(port),
    }
    results: dict[str, tuple[Answer, float]] = {}

    def run(name: str) -> None:
        started = time.monotonic()
        answer = cases[name]()
        results[name] = (answer, time.monotonic() - started)

    with HealthProbe(port) as probe:
        threads = [threading.Thread(target=run, args=(name,)) for name in cases]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(GENEROUS_S + 5)
    assert set(results) == set(cases)
    for name, (answer, elapsed) in results.items():
        assert answer.closed, name
        assert READ_TIMEOUT_S - 0.1 <= elapsed < GENEROUS_S, (name, elapsed)
        if name == "silent":
            assert answer.status is None and answer.body == b"", name
        else:
            assert answer.status == 408, (name, answer)
            assert "not received within 2 s" in _error(answer)["message"], name
    assert probe.answers and all(status == 200 for status in probe.answers), probe.answers
    assert _healthy(port)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.parametrize("family", ["ipv4", "ipv6", "unix"])
def test_connection_addresses_are_uvicorns(loop_kind: str, family: str, tmp_path: Path) -> None:
    """The protocol reads a connection's addresses from the transport's `sockname` / `peername` (not through a
    socket object, as uvicorn does): the same values as uvicorn's own `get_local_addr` / `get_remote_addr` on the
    same connection, for IPv4, IPv6 (four fields cut to two) and unix sockets (no client address)."""
    if family == "ipv6" and not _ipv6_loopback():
        pytest.fail("no IPv6 loopback on this machine: the IPv6 case cannot run")

    async def app(scope: dict, receive: object, send: object) -> None:
        raise AssertionError("no request is sent")

    config = uvicorn.Config(app, log_level="warning")
    protocol = protocol_class(ReadLimits(max_header_bytes=8192, max_header_count=100, request_read_timeout=0))
    assert protocol.response_cycle  # the restated connection_made runs (the installed uvicorn is a checked one)
    seen: list[tuple[object, ...]] = []

    class Probe(protocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            seen.append((self.server, self.client, get_local_addr(transport), get_remote_addr(transport)))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        state = ServerState()

        def factory() -> Probe:
            return Probe(config=config, server_state=state, app_state={}, _loop=loop)

        if family == "unix":
            path = str(tmp_path / "s.sock")
            server = await loop.create_unix_server(factory, path)
            _, writer = await asyncio.open_unix_connection(path)
        else:
            host = "127.0.0.1" if family == "ipv4" else "::1"
            server = await loop.create_server(factory, host, 0)
            _, writer = await asyncio.open_connection(host, server.sockets[0].getsockname()[1])
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()

    if loop_kind == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
    [(server_addr, client_addr, uvicorn_server, uvicorn_client)] = seen
    assert (server_addr, client_addr) == (uvicorn_server, uvicorn_client)
    if family == "unix":
        assert client_addr is None and server_addr == (str(tmp_path / "s.sock"), None)
    else:
        assert client_addr is not None and server_addr is not None and server_addr[1] and client_addr[1]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False
