"""Errors: the closed set a request can end in, its one exception -> status table, and the OpenAI bodies.

Only the client's faults are 4xx: a request that fails validation (:class:`RequestValidationError`, 400,
raised by parsing, sampling-parameter checks, chat rendering and tool-choice constraints) and an explicit
:class:`APIError` with its status (404 model, 401 key, 413 body, 503 capacity...). The engine's own faults
have theirs (503 unavailable, 500 dead, 504 deadline). Anything else is a bug: a 500 with a generic message,
logged with its traceback where it is mapped (:func:`to_api_error`), so an internal ``ValueError`` can no
longer pass for the client's mistake.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import msgspec
from starlette.responses import Response

from pyfront.engine_client.client import EngineDeadError, EngineError, EngineUnavailableError

logger = logging.getLogger("pyfront.server")

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


FORCED_EXIT = "pyfront: forced exit (second Ctrl-C)"
"""The message of the cancel a second Ctrl-C sends to the requests still running (the launcher sends it,
api.lane ends those requests with a 503 or an SSE error event instead of a traceback)."""


class APIError(Exception):
    """An error the client should see as an OpenAI error object."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers


class Overloaded(APIError):
    """The server is at capacity (admission): 503 + Retry-After on the OpenAI routes, Anthropic's 529 on theirs."""


class RequestValidationError(ValueError):
    """A request the server must answer with HTTP 400; ``param`` names the offending field (or None)."""

    status_code = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI error body, shaped like vLLM's ``ErrorResponse``."""
        return {"error": {"message": self.message, "type": "BadRequestError", "param": self.param, "code": 400}}

    def __repr__(self) -> str:
        return f"RequestValidationError({self.message!r}, param={self.param!r})"


class DeadlineExceeded(Exception):
    """The request's deadline (--request-timeout or the X-Request-Timeout header) passed."""


def to_api_error(exc: BaseException) -> APIError:
    """The one exception -> status table. Unexpected exceptions are logged here, once, with their traceback."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestValidationError):
        return APIError(400, exc.message, param=exc.param)
    if isinstance(exc, DeadlineExceeded):
        return APIError(504, f"request timed out: {exc}")
    if isinstance(exc, EngineUnavailableError):
        return APIError(503, str(exc), headers={"Retry-After": "5"})
    if isinstance(exc, EngineDeadError):
        return APIError(500, f"EngineCore encountered an issue: {exc}")
    if isinstance(exc, EngineError):
        return APIError(500, str(exc))
    logger.error("request failed with an unexpected %s", type(exc).__name__, exc_info=exc)
    return APIError(500, f"internal server error ({type(exc).__name__}); the server log has the details")


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        msgspec.json.encode(error_body(status, message, param)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def sse_error_frame(status: int, message: str) -> bytes:
    """An error inside an already-started stream (headers are gone): vLLM sends it as an event."""
    return b"data: " + msgspec.json.encode(error_body(status, message)) + b"\n\n"


# ------------------------------------------------------------------------------ Anthropic's error shape

ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
"""The Messages API routes: every error they give (middleware's 401 and 413 included) is in Anthropic's shape."""

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""Anthropic's error types by status (its API reference, "Errors"); another 4xx is invalid_request_error, a 5xx
api_error. 503 (no engine up) has no type of its own there: overloaded_error says "retry later" as it means."""


def anthropic_status(error: APIError) -> int:
    """The status on an Anthropic route: a full server is Anthropic's 529 (its SDK's OverloadedError), else the same."""
    return 529 if isinstance(error, Overloaded) else error.status


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type": ..., "message": ...}}``, Anthropic's error object."""
    kind = _ANTHROPIC_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(
        msgspec.json.encode(anthropic_error_body(status, message)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def anthropic_sse_error_frame(status: int, message: str) -> bytes:
    """An error inside a started Messages stream: Anthropic's `event: error` (the stream ends after it)."""
    return b"event: error\ndata: " + msgspec.json.encode(anthropic_error_body(status, message)) + b"\n\n"


def error_response_for(
    path: str, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    """The error response in the shape of the route at `path` (for middleware, which answers before any route)."""
    if path in ANTHROPIC_PATHS:
        return anthropic_error_response(status, message, headers)
    return error_response(status, message, param, headers)
