"""The direct exchange (server/http_direct.py): `pyfront serve`'s protocol answers the fast lane's routes without the
ASGI layers, with the same bytes as the ASGI path, and leaves every other request (and every case it does not
cover) to it."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from pyfront.server import http_limits
from pyfront.server.api.middleware.api_key import APIKeyMiddleware
from pyfront.server.api.middleware.body_limit import BodyLimitMiddleware
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from pyfront.server.http_cycle import ResponseCycle
from pyfront.server.http_direct import DirectCycle, DirectLane, proxy_twin
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.harness import API_KEY, MODEL, running_harness

LIMIT = 64 * 1024
"""--max-request-body-bytes of these servers."""
AUTH = f"Authorization: Bearer {API_KEY}\r\n"


def _request(path: str, body: bytes, *, headers: str = AUTH, version: str = "1.1", chunked: bool = False) -> bytes:
    head = f"POST {path} HTTP/{version}\r\nHost: test\r\nContent-Type: application/json\r\n{headers}"
    if chunked:
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _chat(**fields: Any) -> bytes:
    return _json(**{"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **fields})


def _json(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


# Each case: a name, the bytes sent on a fresh connection, and how many responses they bring.
CASES: list[tuple[str, bytes, int]] = [
    ("chat", _request("/v1/chat/completions", _chat()), 1),
    ("chat stream", _request("/v1/chat/completions", _chat(stream=True)), 1),
    ("completion", _request("/v1/completions", _json(model=MODEL, prompt="hi", max_tokens=3)), 1),
    (
        "messages",
        _request("/v1/messages", _json(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi"}])),
        1,
    ),
    ("invalid JSON", _request("/v1/chat/completions", b"{not json"), 1),
    ("unknown model", _request("/v1/chat/completions", _chat(model="nope")), 1),
    ("no API key", _request("/v1/chat/completions", _chat(), headers=""), 1),
    ("a wrong x-api-key on the Messages API", _request("/v1/messages", b"{}", headers="x-api-key: wrong\r\n"), 1),
    ("Content-Length over the limit", _request("/v1/chat/completions", b"x" * (LIMIT + 1)), 1),
    ("chunked body over the limit", _request("/v1/chat/completions", b"x" * (LIMIT + 1), chunked=True), 1),
    ("chunked body", _request("/v1/chat/completions", _chat(), chunked=True), 1),
    ("Connection: close", _request("/v1/chat/completions", _chat(), headers=AUTH + "Connection: close\r\n"), 1),
    ("HTTP/1.0", _request("/v1/chat/completions", _chat(), version="1.0"), 1),
    ("a query string", _request("/v1/chat/completions?x=1", _chat()), 1),
    ("pipelined", _request("/v1/chat/completions", _chat()) * 2 + f"GET /v1/models HTTP/1.1\r\n{AUTH}\r\n".encode(), 3),
]


def _read_response(sock: socket.socket, data: bytearray) -> bytes:
    """One response (by Content-Length, chunked, or to the end of the connection), taken off the front of `data`."""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"closed before a head: {bytes(data)!r}"
        data += piece
    end = data.index(b"\r\n\r\n") + 4
    head = bytes(data[:end]).lower()
    if head.startswith(b"http/1.1 1"):  # an interim response: no body
        size = end
    elif match := re.search(rb"content-length: (\d+)", head):
        size = end + int(match[1])
        while len(data) < size:
            data += sock.recv(65536)
    elif b"transfer-encoding: chunked" in head:
        while not data.endswith(b"0\r\n\r\n"):
            data += sock.recv(65536)
        size = len(data)
    else:
        while piece := sock.recv(65536):
            data += piece
        size = len(data)
    response = bytes(data[:size])
    del data[:size]
    return response


_VARYING = [
    (rb"date: [^\r]*", b"date: D"),
    (rb'"(id|created|created_at|system_fingerprint)": ?("[^"]*"|\d+)', rb'"\1": X'),
    (rb"(chatcmpl|cmpl|msg|resp)-[0-9a-zA-Z_-]+", rb"\1-X"),
]


def _normalized(response: bytes) -> bytes:
    """A response with what differs between any two runs (its date, ids, creation times) masked."""
    for pattern, replacement in _VARYING:
        response = re.sub(pattern, replacement, response)
    return response


def _exchange(port: int, sent: bytes, responses: int) -> tuple[list[bytes], bool]:
    """The responses to `sent` on a new connection, and whether the server then closed it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(sent)
        data = bytearray()
        answers = [_normalized(_read_response(sock, data)) for _ in range(responses)]
        sock.settimeout(0.5)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
        except ConnectionResetError:
            closed = True
    return answers, closed


@pytest.fixture
def direct_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths of the requests the direct exchange served."""
    runs: list[str] = []
    original = DirectCycle.run

    async def counted(self: DirectCycle, tasks: Any) -> None:
        runs.append(self.scope["path"])
        await original(self, tasks)

    monkeypatch.setattr(DirectCycle, "run", counted)
    yield runs


REQUEST_ID_CASES: list[tuple[str, bytes, int]] = [
    ("an id given, an error", _request("/v1/chat/completions", b"{", headers=AUTH + "X-Request-Id: given-1\r\n"), 1),
    ("an id given, no key", _request("/v1/chat/completions", _chat(), headers="X-Request-Id: given-2\r\n"), 1),
    (
        "an id given, a stream",
        _request("/v1/chat/completions", _chat(stream=True), headers=AUTH + "X-Request-Id: given-3\r\n"),
        1,
    ),
]


def _answers(direct: bool, request_ids: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[list[bytes], bool]]:
    with monkeypatch.context() as patch:
        if not direct:
            patch.setattr(http_limits, "direct_lane", lambda app: None)
        overrides = {"max_request_body_bytes": LIMIT, "enable_request_id_headers": request_ids}
        cases = CASES + REQUEST_ID_CASES if request_ids else CASES
        with running_harness(overrides, as_pyfront_serve=True, output_len=3) as harness:
            port = int(harness.base_url.rsplit(":", 1)[1])
            answers = {name: _exchange(port, sent, count) for name, sent, count in cases}
    if request_ids:  # an id the server made up (uuid4 hex) differs run to run
        for name, (responses, closed) in answers.items():
            answers[name] = (
                [re.sub(rb"x-request-id: [0-9a-f]{32}\r", b"x-request-id: U\r", r) for r in responses],
                closed,
            )
    return answers


@pytest.mark.parametrize("request_ids", [False, True], ids=["api key", "api key and request ids"])
def test_the_direct_exchange_writes_what_the_asgi_path_writes(
    request_ids: bool, direct_runs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every case, byte for byte (dates, ids and creation times masked), and the connection closed or kept alike;
    and the lane's requests were the direct exchange's, all but the ones it leaves to the ASGI path."""
    asgi = _answers(False, request_ids, monkeypatch)
    assert direct_runs == []
    direct = _answers(True, request_ids, monkeypatch)
    for name in asgi:
        assert direct[name] == asgi[name], name
    if request_ids:
        assert b"x-request-id: given-1\r" in asgi["an id given, an error"][0][0]
        assert b"x-request-id: given-2\r" in asgi["an id given, no key"][0][0]
        assert b"x-request-id: given-3\r" in asgi["an id given, a stream"][0][0]  # the route's own: the id's base
        assert b"x-request-id: U\r" in asgi["no API key"][0][0]
        assert b"x-request-id: U\r" in asgi["chat"][0][0]
        del direct_runs[-3:]  # the three cases above, direct
    assert asgi["chat"][0][0].startswith(b"HTTP/1.1 200 OK")
    assert b"data: [DONE]" in asgi["chat stream"][0][0]
    assert [answer[:12] for answer in asgi["pipelined"][0]] == [b"HTTP/1.1 200"] * 3
    assert asgi["Content-Length over the limit"][0][0].startswith(b"HTTP/1.1 413")
    assert asgi["chunked body over the limit"][0][0].startswith(b"HTTP/1.1 413")
    assert asgi["no API key"][0][0].startswith(b"HTTP/1.1 401")
    assert asgi["Connection: close"][1] and asgi["HTTP/1.0"][1]
    assert not asgi["chat"][1]
    # Direct: every lane POST of exactly a lane path, in the order sent, but the one with a query string and the
    # second pipelined one (queued behind the first, uvicorn's way).
    chat, completion, messages = "/v1/chat/completions", "/v1/completions", "/v1/messages"
    assert direct_runs == [chat, chat, completion, messages, chat, chat, chat, messages] + [chat] * 6


def test_requests_the_direct_exchange_leaves_to_the_asgi_path(direct_runs: list[str]) -> None:
    """Expect: 100-continue, other routes and methods: all answered, none directly; lane requests with proxy headers
    are direct (their scope rewritten as uvicorn's middleware would: the next test)."""
    with running_harness(as_pyfront_serve=True, output_len=3) as harness:
        port = int(harness.base_url.rsplit(":", 1)[1])
        sent = [
            _request("/v1/chat/completions", _chat(), headers=AUTH + "Expect: 100-continue\r\n"),
            _request("/tokenize", json.dumps({"model": MODEL, "prompt": "hi"}).encode()),
            f"GET /v1/chat/completions HTTP/1.1\r\nHost: t\r\n{AUTH}\r\n".encode(),
            _request("/v1/chat/completions", _chat(), headers=AUTH + "X-Forwarded-For: 10.0.0.1\r\n"),
            _request(
                "/v1/completions",
                _json(model=MODEL, prompt="hi", max_tokens=2),
                headers=AUTH + "X-Forwarded-Proto: https\r\n",
            ),
        ]
        statuses = []
        for request in sent:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(request)
                data = bytearray()
                response = _read_response(sock, data)
                if response.startswith(b"HTTP/1.1 100"):
                    response = _read_response(sock, data)
                statuses.append(int(response.split(b" ", 2)[1]))
        assert statuses == [200, 200, 405, 200, 200]
        assert direct_runs == ["/v1/chat/completions", "/v1/completions"]


def test_proxy_headers_rewrite_the_scope_as_uvicorns_middleware_does() -> None:
    """The direct exchange runs a copy of the server's proxy-headers middleware with nothing after it: the scope it
    leaves (the client the access line names, the scheme) is the one uvicorn's own leaves for the application, from
    a trusted peer and from any other; a server without the middleware has no twin."""
    reached: list[object] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope)

    middleware = ProxyHeadersMiddleware(app, trusted_hosts="127.0.0.1")
    twin = proxy_twin(middleware)
    assert twin is not None and proxy_twin(app) is None
    headers = [(b"x-forwarded-for", b"10.1.2.3, 10.9.9.9"), (b"x-forwarded-proto", b"https")]
    for peer in (("127.0.0.1", 5000), ("192.0.2.7", 5000)):
        theirs = {"type": "http", "client": peer, "scheme": "http", "headers": headers}
        ours = dict(theirs)
        asyncio.run(middleware(theirs, None, None))  # type: ignore[arg-type]
        asyncio.run(twin(ours, None, None))  # type: ignore[arg-type]
        assert ours == theirs
        assert (ours["client"], ours["scheme"]) == (
            (("10.9.9.9", 0), "https") if peer[0] == "127.0.0.1" else (peer, "http")
        )
    assert len(reached) == 2  # the middleware's application, never the twin's


def _config(**fields: Any) -> ServerConfig:
    return ServerConfig(model=BUNDLED_TOKENIZER_NAME, served_model_name=[MODEL], **fields)


def test_the_direct_lane_takes_the_checks_of_the_middleware_it_knows() -> None:
    """The body limit and the API key become the lane's checks, outermost first; any other middleware, or an
    application that is not pyfront's, means no direct exchange, with the reason."""
    plain = DirectLane.of(create_app(_config(max_request_body_bytes=1000)))
    assert isinstance(plain, DirectLane)
    assert plain.body_limit == 1000
    assert [type(check.__self__) for check in plain.checks] == [BodyLimitMiddleware]  # type: ignore[attr-defined]
    keyed = DirectLane.of(create_app(_config(api_key=["k"])))
    assert isinstance(keyed, DirectLane)
    assert [type(check.__self__) for check in keyed.checks] == [  # type: ignore[attr-defined]
        BodyLimitMiddleware,
        APIKeyMiddleware,
    ]
    assert set(keyed.paths) == {b"/v1/chat/completions", b"/v1/completions", b"/v1/responses", b"/v1/messages",
                                b"/v1/messages/count_tokens"}  # fmt: skip
    refusal = keyed.refusal("/v1/chat/completions", [(b"authorization", b"Bearer nope")])
    assert refusal is not None and refusal.status_code == 401
    assert keyed.refusal("/v1/chat/completions", [(b"authorization", b"Bearer k")]) is None
    ids = DirectLane.of(create_app(_config(enable_request_id_headers=True)))
    assert isinstance(ids, DirectLane) and ids.request_ids and not keyed.request_ids
    assert DirectLane.of(create_app(_config(allowed_origins=["*"]))) == (
        "the fast lane runs behind CORSMiddleware, which the direct exchange does not apply"
    )
    assert DirectLane.of(Starlette()) == "the application is a Starlette, not pyfront's"


def test_the_start_up_log_says_why_there_is_no_direct_exchange(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="pyfront.server"):
        protocol = http_limits.protocol_class(
            http_limits.ReadLimits(8192, 100, 0), create_app(_config(allowed_origins=["*"]))
        )
    assert protocol.direct is None
    assert "the fast lane's requests take the ASGI path: the fast lane runs behind CORSMiddleware" in caplog.text
    assert http_limits.protocol_class(http_limits.ReadLimits(8192, 100, 0), create_app(_config())).direct is not None


def test_the_access_line_is_uvicorns() -> None:
    """The direct exchange's access line (client text made once per connection, the lane path as sent) is the one
    uvicorn's helpers make from the scope."""
    lines: list[str] = []

    class Access:
        def info(self, msg: str, *args: Any) -> None:
            lines.append(msg % args)

    scope = {"client": ("::1", 5123), "raw_path": b"/v1/messages", "query_string": b"", "path": "/v1/messages",
             "method": "POST", "http_version": "1.0"}  # fmt: skip
    for kind in (ResponseCycle, DirectCycle):
        cycle = kind.__new__(kind)
        cycle.scope = scope  # type: ignore[assignment]
        cycle.access_logger = Access()  # type: ignore[assignment]
        cycle.access_client = "::1:5123"  # what the protocol makes of the same client
        cycle._log_access(200)
    assert lines == ['::1:5123 - "POST /v1/messages HTTP/1.0" 200'] * 2
