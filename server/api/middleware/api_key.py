"""API keys: `Authorization: Bearer <key>` on every route but the open ones."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from pyfront.server.errors import (
    error_response,
)


class APIKeyMiddleware:
    """Every route needs `Authorization: Bearer <key>` except the open paths (/health, /ready; /metrics unless told).

    OPTIONS needs the key too: a 405 with its Allow header (or a 404) would tell an anonymous client which
    routes exist. CORS preflights never get here: CORSMiddleware, outside this one, answers them itself.

    Keys are compared with hmac.compare_digest against every configured key, so the time taken does not
    depend on how much of a key matched.
    """

    def __init__(self, app: ASGIApp, keys: list[str], open_paths: set[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        token = given[7:] if given[:7].lower() == b"bearer " else b""
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(token, key)
        if not ok:
            await error_response(401, "Unauthorized: a valid API key is required (Authorization: Bearer ...)")(
                scope, receive, send
            )
            return
        await self.app(scope, receive, send)
