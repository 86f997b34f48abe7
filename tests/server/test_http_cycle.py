"""ResponseCycle (server/http_cycle.py) writes the bytes uvicorn's RequestResponseCycle writes, in fewer writes, and
ends every message sequence as uvicorn's does (errors and their words, keep-alive, completion, the access line)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from pyfront.server.extensions import HOLD_HEAD
from pyfront.server.http_cycle import DefaultHeaders, DisconnectWatch, ResponseCycle, unverified_reason
from tests.harness import API_KEY, MODEL, running_harness

DEFAULTS = [(b"date", b"Sun, 06 Dec 2026 19:00:00 GMT"), (b"server", b"uvicorn")]


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Access:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)


def make(kind: type, method: str, keep_alive: bool, defaults: list[tuple[bytes, bytes]], shared: DefaultHeaders):
    transport = FakeTransport()
    completed: list[bool] = []
    access = Access()
    scope = {
        "type": "http",
        "method": method,
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "http_version": "1.1",
        "client": ("127.0.0.1", 5000),
        "root_path": "",
    }
    cycle = RequestResponseCycle(
        scope=scope,  # type: ignore[arg-type]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=access,  # type: ignore[arg-type]
        access_log=True,
        default_headers=defaults,
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: completed.append(True),
    )
    if kind is ResponseCycle:
        cycle.__class__ = ResponseCycle
        cycle.adopt(shared)  # type: ignore[attr-defined]
    return cycle, transport, completed, access


def start(status: int = 200, headers: list[tuple[bytes, bytes]] | None = None, *, hold: bool = False) -> dict[str, Any]:
    message = {"type": "http.response.start", "status": status, "headers": headers or []}
    if hold:
        message[HOLD_HEAD] = True  # uvicorn's own cycle ignores the key
    return message


def body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


JSON = [(b"content-length", b"13"), (b"content-type", b"application/json"), (b"x-request-id", b"abc")]
SEQUENCES: dict[str, list[dict[str, Any]]] = {
    "json": [start(200, JSON), body(b'{"ok": true }')],
    "json in two bodies": [start(200, JSON), body(b'{"ok"', more=True), body(b": true }")],
    "sse": [start(200, [(b"content-type", b"text/event-stream")]), body(b"data: 1\n\n", True), body(b"")],
    "sse with a last chunk": [start(200, []), body(b"data: 1\n\n", True), body(b"data: [DONE]\n\n")],
    "sse, head held": [start(200, [], hold=True), body(b"data: 1\n\n", True), body(b"data: [DONE]\n\n")],
    "sse, held head sent alone": [start(200, [], hold=True), body(b"", True), body(b"data: 1\n\n", True), body(b"")],
    "sse, held head and the end": [start(200, [], hold=True), body(b"data: 1\n\n")],
    "sse, held head, a wrong message": [start(200, [], hold=True), start(200, [])],
    "held head of a length": [start(200, [(b"content-length", b"2")], hold=True), body(b"{}")],
    "empty with length 0": [start(200, [(b"content-length", b"0")]), body(b"")],
    "204": [start(204, []), body(b"")],
    "connection close": [start(200, [(b"content-length", b"2"), (b"Connection", b"keep-alive, Close")]), body(b"{}")],
    "chunked declared": [start(200, [(b"transfer-encoding", b"chunked")]), body(b"ab", True), body(b"")],
    "length then chunked": [start(200, [(b"content-length", b"2"), (b"transfer-encoding", b"chunked")]), body(b"ab")],
    "body too long": [start(200, [(b"content-length", b"2")]), body(b"abc")],
    "body too short": [start(200, [(b"content-length", b"4")]), body(b"abc")],
    "no start": [body(b"x")],
    "a second start": [start(200, [(b"content-length", b"2")]), start(200, [])],
    "after the end": [start(200, [(b"content-length", b"2")]), body(b"{}"), body(b"")],
    "bad header name": [start(200, [(b"bad name", b"x")]), body(b"")],
    "bad header value": [start(200, [(b"x", b"a\r\nb")]), body(b"")],
    "500": [start(500, [(b"content-length", b"21")]), body(b"Internal Server Error")],
}


async def run(cycle: Any, messages: list[dict[str, Any]]) -> tuple[str, str] | None:
    for message in messages:
        try:
            await cycle.send(message)
        except Exception as exc:  # the error itself is compared
            return type(exc).__name__, str(exc)
    return None


@pytest.mark.parametrize("name", SEQUENCES)
@pytest.mark.parametrize("method", ["POST", "HEAD"])
@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("defaults", ["plain", "with connection", "none"])
def test_same_bytes_and_outcome_as_uvicorn(name: str, method: str, keep_alive: bool, defaults: str) -> None:
    default_headers = {
        "plain": DEFAULTS,
        "with connection": [*DEFAULTS, (b"connection", b"close")],
        "none": [],
    }[defaults]
    shared = DefaultHeaders()
    sides = []
    for kind in (RequestResponseCycle, ResponseCycle):
        for _ in range(2):  # twice: the second time from the encoded default headers
            cycle, transport, completed, access = make(kind, method, keep_alive, default_headers, shared)
            error = asyncio.run(run(cycle, SEQUENCES[name]))
            outcome = (
                b"".join(transport.writes),
                error,
                transport.closed,
                completed,
                access.lines,
                cycle.response_started,
                cycle.response_complete,
                cycle.keep_alive,
            )
            sides.append((outcome, len(transport.writes)))
    (theirs, their_writes), _, (ours, our_writes), (ours_again, _) = sides
    assert theirs[4] or name == "no start", "no access line: the sequence never reached the server's own code"
    assert ours == theirs
    assert ours_again == theirs
    assert our_writes <= their_writes


def test_a_response_of_known_length_is_one_write() -> None:
    cycle, transport, completed, _ = make(ResponseCycle, "POST", True, DEFAULTS, DefaultHeaders())
    asyncio.run(run(cycle, SEQUENCES["json"]))
    assert len(transport.writes) == 1 and completed == [True]
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\ndate: ") and transport.writes[0].endswith(b"true }")


def test_a_stream_s_head_is_written_at_once() -> None:
    """A stream's head goes out with its start, before any event: a client sees 200 before the first token."""
    cycle, transport, _, _ = make(ResponseCycle, "POST", True, DEFAULTS, DefaultHeaders())
    asyncio.run(cycle.send(start(200, [(b"content-type", b"text/event-stream")])))
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"\r\n\r\n")


def test_a_held_stream_head_goes_with_the_first_body_message() -> None:
    """With HOLD_HEAD (what SSEResponse sets for push streams) the head waits for the first body message: the
    head and the first event are one write; an empty body message sends the head alone; then as before."""
    cycle, transport, completed, _ = make(ResponseCycle, "POST", True, DEFAULTS, DefaultHeaders())
    asyncio.run(run(cycle, [start(200, [(b"content-type", b"text/event-stream")], hold=True)]))
    assert transport.writes == []
    asyncio.run(run(cycle, [body(b"data: 1\n\n", True)]))
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
    asyncio.run(run(cycle, [body(b"data: [DONE]\n\n")]))
    assert len(transport.writes) == 2 and transport.writes[1].endswith(b"0\r\n\r\n") and completed == [True]

    cycle, transport, _, _ = make(ResponseCycle, "POST", True, DEFAULTS, DefaultHeaders())
    asyncio.run(run(cycle, [start(200, [], hold=True), body(b"", True)]))
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"\r\n\r\n")  # the head alone


def test_a_disconnected_client_gets_nothing_more() -> None:
    for kind in (RequestResponseCycle, ResponseCycle):
        cycle, transport, completed, _ = make(kind, "POST", True, DEFAULTS, DefaultHeaders())
        cycle.disconnected = True
        asyncio.run(run(cycle, SEQUENCES["json"]))
        assert transport.writes == [] and completed == []


def test_the_installed_uvicorn_is_a_verified_release() -> None:
    """The test extra holds uvicorn to releases ResponseCycle was read against (else it would not be used)."""
    import pathlib
    import re
    import tomllib

    from pyfront.server.http_cycle import VERIFIED_UVICORN

    assert unverified_reason() is None
    root = pathlib.Path(__file__).resolve().parents[2]
    test_extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    (bound,) = [m for m in (re.fullmatch(r"uvicorn<(\d+)\.(\d+)", spec.replace(" ", "")) for spec in test_extra) if m]
    newest = max(tuple(int(part) for part in v.rstrip(".").split(".")) for v in VERIFIED_UVICORN)
    assert (int(bound[1]), int(bound[2])) == (newest[0], newest[1] + 1)


def _post(port: int, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def _wait(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("as_pyfront_serve", [True, False], ids=["callback", "watcher task"])
def test_a_client_that_leaves_a_non_streamed_request_aborts_it(
    as_pyfront_serve: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways of seeing a disconnect (the cycle's callback under `pyfront serve`, a watcher task under any other
    server): the engine request is aborted and nothing stays running; a request that completes leaves nothing behind
    (its callback unregistered: closing its connection afterwards aborts nothing)."""
    registered: list[object] = []
    original = DisconnectWatch.when_disconnected

    def spy(self: DisconnectWatch, callback: Any) -> None:
        registered.append(callback)
        original(self, callback)

    monkeypatch.setattr(DisconnectWatch, "when_disconnected", spy)
    slow = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": True}
    quick = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with running_harness(as_pyfront_serve=as_pyfront_serve, output_len=None, step_interval_s=0.01) as harness:
        port = int(harness.base_url.rsplit(":", 1)[1])
        before = harness.mock_totals()
        sock = _post(port, json.dumps(quick).encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        sock.close()
        time.sleep(0.2)
        assert harness.mock_totals()["aborts"] == before["aborts"]
        sock = _post(port, json.dumps(slow).encode())
        _wait(lambda: harness.mock_totals()["running"] >= 1)
        sock.close()
        _wait(lambda: harness.mock_totals()["running"] == 0)
        assert harness.mock_totals()["aborts"] == before["aborts"] + 1
        with harness.http() as http:  # the server serves on
            assert http.post("/v1/chat/completions", json=quick).status_code == 200
    if as_pyfront_serve:  # each request registered its callback and took it back (the aborted one's was spent)
        assert [callback is None for callback in registered] == [False, True, False, True, False, True]
    else:
        assert registered == []


@pytest.mark.parametrize("as_pyfront_serve", [True, False], ids=["callback", "watcher task"])
def test_a_client_that_leaves_a_stream_aborts_it(as_pyfront_serve: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed response learns of the disconnect as the non-streamed one does: from the cycle's callback under
    `pyfront serve` (no watcher task: SSEResponse registers its own callback and takes it back), from a watcher
    task under any other server. Either way the stream is cancelled and its engine request aborted, mid-stream."""
    registered: list[object] = []
    original = DisconnectWatch.when_disconnected

    def spy(self: DisconnectWatch, callback: Any) -> None:
        registered.append(callback)
        original(self, callback)

    monkeypatch.setattr(DisconnectWatch, "when_disconnected", spy)
    slow = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    with running_harness(as_pyfront_serve=as_pyfront_serve, output_len=None, step_interval_s=0.01) as harness:
        port = int(harness.base_url.rsplit(":", 1)[1])
        before = harness.mock_totals()
        sock = _post(port, json.dumps(slow).encode())
        received = b""
        while b"data: {" not in received:  # the stream is running: its first frame is out
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200 OK")
        sock.close()
        _wait(lambda: harness.mock_totals()["running"] == 0)
        assert harness.mock_totals()["aborts"] == before["aborts"] + 1
        with harness.http() as http:  # the server serves on
            quick = {**slow, "max_tokens": 2, "ignore_eos": False}
            assert http.post("/v1/chat/completions", json=quick).status_code == 200
    if as_pyfront_serve:  # per stream: the lane's callback (taken back once the handler returned), then the SSE one
        assert [callback is None for callback in registered] == [False, True, False, True, False, True, False, True]
    else:
        assert registered == []
