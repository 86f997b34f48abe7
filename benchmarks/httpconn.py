"""One keep-alive HTTP/1.1 connection on asyncio streams: the client of benchmarks/loadgen.py, soak.py and routing.py.

No HTTP library, on purpose. loadgen.py shares its core with the mock engine and must cost next to nothing, so it
reads streamed bodies straight off the socket (``Conn.reader``) once the head is parsed here. soak.py must make
real socket closes (a client disconnect is a FIN, or an RST with ``close(reset=True)``) and must see every byte
the server gets wrong: a malformed status line, header block or chunk framing raises `HTTPError`, which soak.py
counts as its error kind ``bad_http``. A connection that the server closed before the status line raises
`ConnectionResetError` instead, so that soak.py can tell a stale keep-alive connection (retried once) from a
broken response.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

READ_LIMIT = 1 << 22  # StreamReader limit (both scripts had 4 MiB): longest line read, buffer before pausing reads


class HTTPError(Exception):
    """A malformed HTTP response (soak.py's kind `bad_http`)."""


class Conn:
    """One keep-alive HTTP/1.1 connection to host:port, opened again when the server has closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = 0  # requests sent since the connection was opened: a reused one may have been closed meanwhile

    @property
    def is_open(self) -> bool:
        """Whether a request can be written: connected, not closing, and no FIN from the server yet."""
        return not (self.writer is None or self.writer.is_closing() or self.reader is None or self.reader.at_eof())

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=READ_LIMIT)
        self.used = 0

    async def ensure(self) -> None:
        """Open the connection unless it is open."""
        if not self.is_open:
            self.close()
            await self.open()

    def close(self, reset: bool = False) -> None:
        """Close with a FIN (after what is still buffered), or with an RST that drops it (`reset`)."""
        if self.writer is not None:
            if reset:
                self.writer.transport.abort()
            else:
                self.writer.close()
        self.reader = self.writer = None

    async def send(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        accept: str | None = None,
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> float:
        """Write one request on the open connection and wait until the transport has taken it (so that a
        `close(reset=True)` right after cannot drop part of it). Returns the wall time just before the write:
        the send time that loadgen.py's latencies start from.

        The headers: Host; for a body its JSON Content-Type; `Accept`; the body's Content-Length; `X-Request-Id`;
        then `headers` in their order (routing.py's `X-data-parallel-rank`). Each only where it applies, always in
        this order, so that a run's requests are the same bytes from one version of the scripts to the next."""
        assert self.writer is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        if accept is not None:
            head += f"Accept: {accept}\r\n"
        if body is not None:
            head += f"Content-Length: {len(body)}\r\n"
        if request_id:
            head += f"X-Request-Id: {request_id}\r\n"
        for name, value in (headers or {}).items():
            head += f"{name}: {value}\r\n"
        data = head.encode() + b"\r\n" + (body or b"")
        sent = time.time()
        self.writer.write(data)
        await self.writer.drain()
        self.used += 1
        return sent

    async def read_head(self) -> tuple[int, dict[str, str]]:
        """The status code and the headers (names lower-cased) of the next response."""
        assert self.reader is not None
        line = await self.reader.readline()
        if not line:
            raise ConnectionResetError("connection closed before the status line")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise HTTPError(f"bad status line {line[:80]!r}")
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise HTTPError("connection closed inside the headers")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers

    async def chunks(self, headers: dict[str, str], *, until_close: bool = False) -> AsyncIterator[bytes]:
        """The body, piece by piece: by Content-Length, or chunked transfer encoding. A body with neither is
        an `HTTPError`, or with `until_close` (a tolerant client) everything up to the server's close."""
        assert self.reader is not None
        if "content-length" in headers:
            yield await self.reader.readexactly(int(headers["content-length"]))
            return
        if headers.get("transfer-encoding", "").lower() != "chunked":
            if not until_close:
                raise HTTPError(f"neither Content-Length nor chunked: {headers}")
            yield await self.reader.read()
            return
        while True:
            size_line = await self.reader.readline()
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise HTTPError(f"bad chunk size line {size_line[:40]!r}") from None
            if size == 0:
                await self.reader.readline()  # the CRLF after the last chunk (no trailers)
                return
            data = await self.reader.readexactly(size)
            if await self.reader.readexactly(2) != b"\r\n":
                raise HTTPError("chunk not followed by CRLF")
            yield data

    async def read_body(self, headers: dict[str, str], *, until_close: bool = False) -> bytes:
        return b"".join([piece async for piece in self.chunks(headers, until_close=until_close)])

    async def read_response(self, *, until_close: bool = False) -> tuple[int, dict[str, str], bytes]:
        """The next response whole: (status, headers, body). Closes the connection if the server said so."""
        status, headers = await self.read_head()
        body = await self.read_body(headers, until_close=until_close)
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, body

    async def get_json(self, path: str) -> tuple[int, Any]:
        """GET `path`: (status, the body decoded as JSON if its Content-Type says JSON, else the raw bytes)."""
        await self.ensure()
        await self.send("GET", path)
        status, headers, body = await self.read_response()
        return status, (json.loads(body) if headers.get("content-type", "").startswith("application/json") else body)
