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
