"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}` with the right status."""

from __future__ import annotations

from http import HTTPStatus

import msgspec
from starlette.responses import Response

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


class APIError(Exception):
    """An error the client should see as an OpenAI error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None) -> dict:
    kind = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> Response:
    return Response(
        msgspec.json.encode(error_body(status, message, param)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def sse_error_frame(status: int, message: str) -> bytes:
    """An error inside an already-started stream (headers are gone): vLLM sends it as an event."""
    return b"data: " + msgspec.json.encode(error_body(status, message)) + b"\n\n"
