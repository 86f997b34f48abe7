"""Request body size limit: 413 by Content-Length, or while the body is read (BodyTooLarge, an APIError)."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pyfront.server.errors import APIError, error_response_for


class BodyLimitMiddleware:
    """Refuse request bodies over `limit` bytes with 413, by Content-Length or while reading."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope["path"], scope["headers"])
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        received = 0
        limit = self.limit

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)

    def refusal(self, path: str, headers: list[tuple[bytes, bytes]]) -> Response | None:
        """The 413 for a request whose Content-Length is over the limit, before any of its body is read; None
        for any other. Also the check of `pyfront serve`'s direct exchange (server/http_direct.py)."""
        for name, value in headers:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                return error_response_for(path, 413, BodyTooLarge(self.limit).message)
        return None


class BodyTooLarge(APIError):
    """Raised from `receive` once a body (chunked, or longer than it said) passes the limit: a 413.

    An APIError, so whoever reads the body answers it the way it answers its other errors: the fast lane
    and FastAPI's handlers alike (an exception of its own became a 500 on the fast lane).
    """

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds the {limit}-byte limit")
