"""Responses every route shares: pre-encoded JSON, the OpenAI error body for an exception, id headers."""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pyfront.engine_client.client import EngineError
from pyfront.server.config import ServerConfig
from pyfront.server.errors import (
    ANTHROPIC_PATHS,
    APIError,
    DeadlineExceeded,
    RequestValidationError,
    anthropic_error_response,
    anthropic_status,
    error_response,
    error_response_for,
    to_api_error,
)
from pyfront.server.openai.validate import valid_header_value
from pyfront.server.state import ServingState

_encode = msgspec.json.encode


class EncodedJSON(Response):
    """A 200 JSON response from bytes already encoded, its headers built as raw pairs in one go.

    For the completion routes' non-streamed answers: Starlette's Response builds its headers through
    MutableHeaders, a measurable share of a one-token request.
    """

    def __init__(self, body: bytes, headers: dict[str, str]) -> None:
        self.body = body
        self.status_code = 200
        self.background = None
        self.extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()] if headers else []
        """The headers after content-length and content-type (`pyfront serve` writes the two itself: http_cycle)."""
        self.raw_headers = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json"), *self.extra]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


def json_response(body: Any, status: int = 200) -> Response:
    return Response(_encode(body), status_code=status, media_type="application/json")


def exception_response(state: ServingState, exc: Exception, path: str = "") -> Response:
    """The error response for an exception raised while handling a request at `path` (counted in metrics).

    OpenAI's error body, or Anthropic's on the Messages API routes (errors.ANTHROPIC_PATHS).
    """
    if isinstance(exc, ClientDisconnect):
        # The client left while its body was read (FastAPI's routes; the fast lane sees it as None): nobody
        # reads this answer, and it is no server fault to log.
        return error_response_for(path, 400, "the client disconnected before sending its whole request")
    if isinstance(exc, StarletteHTTPException):
        message = "Not Found" if exc.status_code == 404 else str(exc.detail)
        return error_response_for(path, exc.status_code, message, headers=getattr(exc, "headers", None))
    error = to_api_error(exc)  # logs the unexpected ones
    if path in ANTHROPIC_PATHS:
        status = anthropic_status(error)
        state.metrics.error(status)
        return anthropic_error_response(status, error.message, error.headers)
    state.metrics.error(error.status)
    return error_response(error.status, error.message, error.param, error.headers)


def add_error_handlers(app: FastAPI, state: ServingState) -> None:
    async def handle(request: Request, exc: Exception) -> Response:
        return exception_response(state, exc, request.scope["path"])

    # Handlers for specific classes run in Starlette's ExceptionMiddleware and answer cleanly; a handler
    # for Exception runs in ServerErrorMiddleware, which re-raises after answering (for real bugs only).
    for kind in (APIError, RequestValidationError, StarletteHTTPException, DeadlineExceeded, EngineError,
                 ValueError, ClientDisconnect, Exception):  # fmt: skip
        app.add_exception_handler(kind, handle)


def id_headers(config: ServerConfig, base: str) -> dict[str, str]:
    """The completion routes' X-Request-Id (the id in the body) with --enable-request-id-headers, if safe to send."""
    return {"x-request-id": base} if config.enable_request_id_headers and valid_header_value(base) else {}
