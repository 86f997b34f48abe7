"""uvicorn's access log line, written without the logging machinery when the logger is as uvicorn sets it up.

Every response logs one line (`INFO:     127.0.0.1:5123 - "POST /v1/chat/completions HTTP/1.1" 200 OK`), as
vLLM's server does. Through `logging` that line costs more than a short request's render: a LogRecord, the
caller's frame looked up, uvicorn's AccessFormatter copying the record to format it, and a flush (one write
system call) per line; in a py-spy profile of peers.py's sequential row it was ~4% of the server's CPU.

`AccessLine` stands in for the `uvicorn.access` logger in the protocol (`HttpToolsProtocol.access_logger`:
uvicorn calls its `info` once per response). When the logger is exactly in uvicorn's default set-up (one
StreamHandler, uvicorn's AccessFormatter with its default format and no colours, no filters), it writes the same
line itself: the text is checked at first use against what the formatter makes of a sample record.

Lines are kept here and written together, one `write` and one flush, `FLUSH_AFTER_S` after the first of them, so
`tail -f` and `docker logs` see them with at most that delay. Writing each line to the stream at once is not the
same: under `PYTHONUNBUFFERED=1`, which Python images set as a rule (ours included: docker/Dockerfile), the stream
writes through, and every line was its own system call, one per request (an strace of 256 streamed requests: 256
writes to stdout). Lines still held when the process exits are written by an `atexit` hook; a process killed
outright loses at most the last `FLUSH_AFTER_S` of them. Anything else (a log config of the user's, colours on a
terminal, a filter, another message) goes to the logger itself, unchanged; so do the held lines if the stream
fails.
"""

from __future__ import annotations

import asyncio
import atexit
import http
import logging
from typing import Any

FLUSH_AFTER_S = 0.05

UVICORN_ACCESS_MESSAGE = '%s - "%s %s HTTP/%s" %d'
"""What uvicorn's httptools and h11 protocols pass to `access_logger.info` (uvicorn 0.3x-0.5x)."""

UVICORN_ACCESS_FORMAT = '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'
"""uvicorn's default format of the access formatter (uvicorn.config.LOGGING_CONFIG)."""

_PHRASES = {status.value: status.phrase for status in http.HTTPStatus}

logger = logging.getLogger("pyfront.server")


class AccessLine:
    """The protocol's access logger: `info(msg, client, method, path, http_version, status)` as uvicorn calls it."""

    def __init__(self, target: logging.Logger | None = None) -> None:
        self.logger = target if target is not None else logging.getLogger("uvicorn.access")
        self._resolved = False
        self._stream: Any = None
        """The handler's stream when lines are written here; None: they go through the logger."""
        self._handler: logging.Handler | None = None
        self._prefix = ""
        self._held: list[tuple[Any, ...]] = []
        """The arguments of the lines not written yet (formatted when written)."""
        self._exit_hook = False
        self.reason: str | None = None
        """Why lines go through the logger (None while they are written here, or before the first line)."""

    def info(self, msg: str, *args: Any) -> None:
        if not self._resolved:
            self._resolve()
        if self._stream is None or msg != UVICORN_ACCESS_MESSAGE or len(args) != 5:
            self.logger.info(msg, *args)
            return
        if not self.logger.isEnabledFor(logging.INFO):
            return
        held = self._held
        held.append(args)
        if len(held) == 1:
            asyncio.get_running_loop().call_later(FLUSH_AFTER_S, self.flush)
            if not self._exit_hook:
                self._exit_hook = True
                atexit.register(self.flush)

    def flush(self) -> None:
        """Write the held lines in one piece and flush the stream (the timer's and the exit hook's call)."""
        held, self._held = self._held, []
        if not held:
            return
        prefix, phrases = self._prefix, _PHRASES
        text = "".join(
            f'{prefix}{client} - "{method} {path} HTTP/{version}" {status} {phrases.get(status, "")}\n'
            for client, method, path, version, status in held
        )
        try:
            self._stream.write(text)
            if self._handler is not None:
                self._handler.flush()  # StreamHandler.flush: takes the handler's lock, ignores a closed stream
        except (OSError, ValueError) as exc:  # a closed or broken stream: the logger reports it its own way
            self._stream = None
            self.reason = f"writing to the stream failed ({exc})"
            for args in held:
                self.logger.info(UVICORN_ACCESS_MESSAGE, *args)

    def _resolve(self) -> None:
        """Decide once, at the first line (uvicorn has configured logging by then), how lines are written."""
        self._resolved = True
        self.reason = self._unsupported()
        if self.reason is not None:
            logger.debug("access log lines go through logging: %s", self.reason)

    def _unsupported(self) -> str | None:
        from uvicorn.logging import AccessFormatter

        log = self.logger
        if log.filters or log.propagate or len(log.handlers) != 1:
            return "the uvicorn.access logger is not as uvicorn's default log config sets it up"
        handler = log.handlers[0]
        if type(handler) is not logging.StreamHandler or handler.filters or handler.level > logging.INFO:
            return "its handler is not a plain StreamHandler"
        formatter = handler.formatter
        if type(formatter) is not AccessFormatter or formatter._fmt != UVICORN_ACCESS_FORMAT:
            return "its formatter is not uvicorn's AccessFormatter with the default format"
        if formatter.use_colors:
            return "colours are on"
        # What comes before the client address: the level prefix and the format's space (checked below).
        self._prefix = formatter.formatMessage(_record(logging.INFO, "\0", "GET", "/", "1.1", 200)).split("\0")[0]
        self._stream, self._handler = handler.stream, handler
        samples = (("127.0.0.1:5123", "POST", "/v1/chat/completions?x=1", "1.1", 200), ("::1", "GET", "/", "1.0", 599))
        for client, method, path, version, status in samples:
            want = formatter.format(_record(logging.INFO, client, method, path, version, status)) + handler.terminator
            got = f'{self._prefix}{client} - "{method} {path} HTTP/{version}" {status} {_PHRASES.get(status, "")}\n'
            if got != want:
                self._stream = self._handler = None
                return f"the formatter's line differs from this class's: {want!r} != {got!r}"
        return None


def _record(level: int, *args: Any) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.access", level, __file__, 0, UVICORN_ACCESS_MESSAGE, args, None)
