"""The user middleware, as one list: the application builds it once, around FastAPI's routes and the fast lane.

`user_middleware(config)` is the whole list, outermost first (Starlette's order). `PyfrontApp` hands it to
FastAPI and, when Starlette builds its stack, wraps the fast lane in the same list (api.lane), so a
middleware added here, or with `app.add_middleware`, covers every route.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from pyfront.server.api.middleware.api_key import APIKeyMiddleware
from pyfront.server.api.middleware.body_limit import BodyLimitMiddleware
from pyfront.server.api.middleware.request_id import RequestIdHeaderMiddleware
from pyfront.server.config import ServerConfig

OPEN_PATHS = frozenset({"/health", "/ready"})
"""Routes that answer without an API key (load balancers and orchestrators probe them); /metrics too unless
--metrics-require-api-key."""


def user_middleware(config: ServerConfig) -> list[Middleware]:
    """The middleware the configuration asks for, outermost first.

    Request ids outermost, so that even a 413 or a 401 carries one; the body limit before CORS and the API
    key, as before; the API key innermost, so that CORS preflights (OPTIONS) are answered without one.
    """
    stack = []
    if config.enable_request_id_headers:
        stack.append(Middleware(RequestIdHeaderMiddleware))
    stack.append(Middleware(BodyLimitMiddleware, limit=config.max_request_body_bytes))
    if config.allowed_origins:
        stack.append(
            Middleware(CORSMiddleware, allow_origins=config.allowed_origins, allow_methods=["*"], allow_headers=["*"])
        )
    if config.api_key:
        open_paths = set(OPEN_PATHS) | (set() if config.metrics_require_api_key else {"/metrics"})
        stack.append(Middleware(APIKeyMiddleware, keys=config.api_key, open_paths=open_paths))
    return stack
