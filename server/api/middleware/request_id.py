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
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = RequestHeaders(scope["headers"]).request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    value = given if given is not None and valid_header_value(given) else uuid.uuid4().hex
                    headers.append((b"x-request-id", value.encode("latin-1")))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)
