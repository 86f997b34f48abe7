"""`--enable-request-id-headers`: an X-Request-Id header on every response."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pyfront.server.api.request import RequestHeaders
from pyfront.server.openai.validate import valid_header_value


class RequestIdHeaderMiddleware:
    """`--enable-request-id-headers`: every response gets an X-Request-Id header, as in vLLM.

    The completion routes set it themselves to the id their response carries; on every other response it
    is the request's own X-Request-Id, or a new uuid4 hex when there is none or it is not a safe header value.
    `with_id` and `id_header` are also what `pyfront serve`'s direct exchange applies (server/http_direct.py).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, self.with_id(scope["headers"], send))

    @staticmethod
    def with_id(headers: list[tuple[bytes, bytes]], send: Send) -> Send:
        """`send`, adding the header to a response start that has no X-Request-Id of its own."""

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                response_headers = list(message.get("headers", ()))
                if not has_request_id(response_headers):
                    response_headers.append(RequestIdHeaderMiddleware.id_header(headers))
                    message = {**message, "headers": response_headers}
            await send(message)

        return send_with_id

    @staticmethod
    def id_header(headers: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
        """The header for a response to a request with these headers that has none of its own."""
        given = RequestHeaders(headers).request_id
        value = given if given is not None and valid_header_value(given) else uuid.uuid4().hex
        return (b"x-request-id", value.encode("latin-1"))


def has_request_id(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() == b"x-request-id" for name, _ in headers)
