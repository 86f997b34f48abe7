"""Request body size limit: 413 by Content-Length, or while the body is read (BodyTooLarge, an APIError)."""

from __future__ import annotations

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
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._refuse(scope, receive, send)
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

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_response_for(scope["path"], 413, BodyTooLarge(self.limit).message)(scope, receive, send)


class BodyTooLarge(APIError):
    """Raised from `receive` once a body (chunked, or longer than it said) passes the limit: a 413.

    An APIError, so whoever reads the body answers it the way it answers its other errors: the fast lane
    and FastAPI's handlers alike (an exception of its own became a 500 on the fast lane).
    """

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds the {limit}-byte limit")
