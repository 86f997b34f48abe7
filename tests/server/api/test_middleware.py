"""One middleware list for every route: FastAPI's routes and the fast lane get the same stack, built once.

In-process (httpx's ASGITransport, no lifespan, so no engine: the completion routes answer 503), which is
enough to see which middleware a request passed through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pyfront.server.api.middleware import user_middleware
from pyfront.server.api.middleware.api_key import APIKeyMiddleware
from pyfront.server.api.middleware.body_limit import BodyLimitMiddleware
from pyfront.server.api.middleware.request_id import RequestIdHeaderMiddleware
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME

pytestmark = pytest.mark.anyio

ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models")]


class StampMiddleware:
    """Adds `x-stamp: <name>` to every response (appends, so the order of several shows)."""

    def __init__(self, app: ASGIApp, name: str) -> None:
        self.app = app
        self.name = name.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"x-stamp", self.name)]}
            await send(message)

        await self.app(scope, receive, stamped)


def config(**overrides: object) -> ServerConfig:
    return ServerConfig(model=BUNDLED_TOKENIZER_NAME, served_model_name=["m"], **overrides)  # type: ignore[arg-type]


def client(app: ASGIApp, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", headers=headers)


def test_the_list_follows_the_configuration_outermost_first() -> None:
    assert [m.cls for m in user_middleware(config())] == [BodyLimitMiddleware]
    full = user_middleware(config(api_key=["k"], enable_request_id_headers=True, allowed_origins=["*"]))
    names = [m.cls.__name__ for m in full]
    assert names == ["RequestIdHeaderMiddleware", "BodyLimitMiddleware", "CORSMiddleware", "APIKeyMiddleware"]
    assert full[0].cls is RequestIdHeaderMiddleware and full[-1].cls is APIKeyMiddleware


async def test_add_middleware_covers_the_fast_lane_too() -> None:
    app = create_app(config())
    app.add_middleware(StampMiddleware, name="inner")
    app.add_middleware(StampMiddleware, name="outer")
    async with client(app) as http:
        for method, path in ROUTES:
            response = await http.request(method, path, json={"model": "m", "prompt": "x", "messages": []})
            assert response.headers.get_list("x-stamp") == ["inner", "outer"], path
    with pytest.raises(RuntimeError):  # Starlette's rule: the stack is built once, at the first request
        app.add_middleware(StampMiddleware, name="late")


async def test_configured_middleware_runs_on_both_paths() -> None:
    app = create_app(config(api_key=["secret"], enable_request_id_headers=True, max_request_body_bytes=64))
    async with client(app) as http:
        for method, path in ROUTES:
            refused = await http.request(method, path)
            assert refused.status_code == 401, path
            assert refused.json()["error"]["code"] == 401
            assert refused.headers["x-request-id"]  # request ids are outside the API key check
        big = await http.post("/v1/completions", content=b"x" * 100, headers={"Authorization": "Bearer secret"})
        assert big.status_code == 413
        assert (await http.get("/health")).status_code == 503  # open path: no key needed (and no engine)


async def chunks(body: bytes, size: int = 16) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
async def test_a_chunked_body_over_the_limit_is_a_413_on_every_route(path: str) -> None:
    """No Content-Length to refuse by: the limit trips while reading, on the fast lane as on FastAPI's routes."""
    app = create_app(config(max_request_body_bytes=64))
    body = b'{"model": "m", "prompt": "' + b"x" * 200 + b'"}'
    async with client(app) as http:
        response = await http.post(path, content=chunks(body), headers={"content-type": "application/json"})
    assert "content-length" not in response.request.headers
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == 413


async def test_options_needs_the_key_so_it_does_not_reveal_the_routes() -> None:
    app = create_app(config(api_key=["secret"]))
    async with client(app) as http:
        for path in ("/v1/completions", "/v1/models", "/no/such/route"):
            assert (await http.options(path)).status_code == 401, path
        allowed = await http.options("/v1/completions", headers={"Authorization": "Bearer secret"})
        assert allowed.status_code == 405


async def test_cors_preflights_still_need_no_key() -> None:
    app = create_app(config(api_key=["secret"], allowed_origins=["https://app.example"]))
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    async with client(app) as http:
        response = await http.options("/v1/chat/completions", headers=preflight)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://app.example"


@pytest.mark.parametrize("trusted", [False, True])
async def test_tokenize_follows_trust_request_chat_template(trusted: bool) -> None:
    """As on /v1/chat/completions (vLLM's /tokenize honours the flag too)."""
    app = create_app(config(trust_request_chat_template=trusted))
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ messages[0].content }}"}
    async with client(app) as http:
        response = await http.post("/tokenize", json=body)
    if trusted:
        assert response.status_code == 200, response.text
        assert response.json()["count"] == 1
    else:
        assert response.status_code == 400
