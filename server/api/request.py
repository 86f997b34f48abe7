"""What a handler reads from the HTTP request: the body (parsed off the loop when large) and the headers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from starlette.types import Receive

logger = logging.getLogger("pyfront.server")


LARGE_BODY_BYTES = 256 * 1024


async def decode_body(decode: Callable[[bytes], Any], raw: bytes, pool: Executor) -> Any:
    """Parse a request body once; a long chat history is parsed on a worker thread (`pool`, the render pool: a
    plain executor's hop costs ~80 us here, anyio's to_thread ~130 us), not on the event loop."""
    if len(raw) < LARGE_BODY_BYTES:
        return decode(raw)
    return await asyncio.get_running_loop().run_in_executor(pool, decode, raw)


async def read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class RequestHeaders:
    """The request headers the completion handlers read, found in one pass over the raw ASGI list."""

    __slots__ = ("data_parallel_rank", "request_id", "timeout")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.request_id: str | None = None
        self.timeout: str | None = None
        self.data_parallel_rank: str | None = None
        for name, value in headers:
            if name == b"x-request-id":
                self.request_id = value.decode("latin-1")
            elif name == b"x-request-timeout":
                self.timeout = value.decode("latin-1")
            elif name == b"x-data-parallel-rank":
                self.data_parallel_rank = value.decode("latin-1")


_LOGGED_PARAMS = ("stream", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop")


def log_request(request_id: str, route: str, prompt_tokens: int, body: Any) -> None:
    """`--enable-log-requests`: one line per admitted request, with the parameters it set (never the prompt)."""
    params = ", ".join(f"{k}={v!r}" for k in _LOGGED_PARAMS if (v := getattr(body, k, None)) is not None)
    logger.info("request %s: POST %s, %d prompt tokens, %s", request_id, route, prompt_tokens, params)
