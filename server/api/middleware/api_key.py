"""API keys: `Authorization: Bearer <key>` on every route but the open ones; `x-api-key` too on the Messages API's."""

from __future__ import annotations

import hmac

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from pyfront.server.errors import ANTHROPIC_PATHS, error_response_for


class APIKeyMiddleware:
    """Every route needs `Authorization: Bearer <key>` except the open paths (/health, /ready; /metrics unless told).

    OPTIONS needs the key too: a 405 with its Allow header (or a 404) would tell an anonymous client which
    routes exist. CORS preflights never get here: CORSMiddleware, outside this one, answers them itself.

    Keys are compared with hmac.compare_digest against every configured key, so the time taken does not
    depend on how much of a key matched.

    The Messages API routes (errors.ANTHROPIC_PATHS) also take Anthropic's `x-api-key: <key>`, the header its
    SDKs send; vLLM 0.32 reads only the bearer token everywhere, which an Anthropic client cannot send by
    default. The other routes stay bearer-only, as vLLM's.
    """

    def __init__(self, app: ASGIApp, keys: list[str], open_paths: set[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(scope["path"], scope["headers"]) if scope["type"] == "http" else None
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, path: str, headers: list[tuple[bytes, bytes]]) -> Response | None:
        """The 401 for a request to `path` without a valid key; None when it may go on. Also the check of
        `pyfront serve`'s direct exchange (server/http_direct.py)."""
        if path in self.open_paths:
            return None
        anthropic = path in ANTHROPIC_PATHS
        given = b""
        x_api_key: bytes | None = None
        for name, value in headers:
            if name == b"authorization" and not given:
                given = value
            elif name == b"x-api-key" and anthropic and x_api_key is None:
                x_api_key = value
        tokens = [given[7:] if given[:7].lower() == b"bearer " else b""]
        if x_api_key is not None:
            tokens.append(x_api_key)
        ok = False
        for token in tokens:
            for key in self.keys:
                ok |= hmac.compare_digest(token, key)
        if ok:
            return None
        how = "x-api-key or Authorization: Bearer" if anthropic else "Authorization: Bearer ..."
        return error_response_for(path, 401, f"Unauthorized: a valid API key is required ({how})")
