"""server/access_log.py: the access line written directly is exactly the one uvicorn's logger writes, it is
flushed within FLUSH_AFTER_S, and any set-up other than uvicorn's default goes through the logger unchanged."""

from __future__ import annotations

import asyncio
import copy
import io
import logging
import logging.config

import pytest
from uvicorn.config import LOGGING_CONFIG

from pyfront.server.access_log import FLUSH_AFTER_S, UVICORN_ACCESS_MESSAGE, AccessLine

CALLS = [
    ("127.0.0.1:51504", "POST", "/v1/chat/completions", "1.1", 200),
    ("[::1]:8080", "GET", "/v1/models?x=1&y=%20", "1.0", 404),
    ("10.0.0.7:1", "POST", "/v1/responses", "1.1", 599),  # no phrase
    ("", "GET", "/health", "1.1", 503),
]


class FlushCounter(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def _uvicorn_logger(name: str, stream: io.StringIO, *, colors: bool = False, fmt: str | None = None) -> logging.Logger:
    """A logger configured exactly as uvicorn's default LOGGING_CONFIG does "uvicorn.access", on `stream`."""
    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["formatters"]["access"]["use_colors"] = colors
    if fmt is not None:
        cfg["formatters"]["access"]["fmt"] = fmt
    cfg["handlers"]["access"]["stream"] = stream
    cfg["loggers"] = {name: {**cfg["loggers"]["uvicorn.access"]}}
    cfg["disable_existing_loggers"] = False
    del cfg["handlers"]["default"], cfg["formatters"]["default"]
    logging.config.dictConfig(cfg)
    return logging.getLogger(name)


def _lines(target: logging.Logger, line: AccessLine | None) -> None:
    async def run() -> None:
        for args in CALLS:
            (line or target).info(UVICORN_ACCESS_MESSAGE, *args)
        await asyncio.sleep(FLUSH_AFTER_S * 3)

    asyncio.run(run())


def test_direct_lines_equal_the_loggers() -> None:
    mine, theirs = FlushCounter(), FlushCounter()
    line = AccessLine(_uvicorn_logger("test.access.direct", mine))
    _lines(line.logger, line)
    assert line.reason is None and line._stream is mine  # the direct path ran
    assert mine.flushes == 1  # four lines, one flush: FLUSH_AFTER_S after the first
    _lines(_uvicorn_logger("test.access.reference", theirs), None)  # (dictConfig flushes existing handlers)
    assert mine.getvalue() == theirs.getvalue()
    assert mine.getvalue().splitlines()[0] == 'INFO:     127.0.0.1:51504 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    assert theirs.flushes == len(CALLS)


def test_a_disabled_level_writes_nothing() -> None:
    out = FlushCounter()
    target = _uvicorn_logger("test.access.quiet", out)
    target.setLevel(logging.WARNING)
    line = AccessLine(target)
    _lines(target, line)
    assert out.getvalue() == "" and line._stream is out


@pytest.mark.parametrize("change", ["colors", "format", "filter", "second handler", "propagate"])
def test_other_setups_go_through_the_logger(change: str) -> None:
    mine, theirs = FlushCounter(), FlushCounter()
    colors = change == "colors"
    fmt = "%(asctime)s %(client_addr)s %(status_code)s" if change == "format" else None
    target = _uvicorn_logger(f"test.access.{change}", mine, colors=colors, fmt=fmt)
    reference = _uvicorn_logger(f"test.access.{change}.ref", theirs, colors=colors, fmt=fmt)
    records: list[logging.LogRecord] = []
    if change == "filter":
        target.addFilter(lambda r: records.append(r) or True)
    elif change == "second handler":
        target.addHandler(logging.NullHandler())
    elif change == "propagate":
        target.propagate = True
    line = AccessLine(target)
    _lines(target, line)
    assert line._stream is None and line.reason
    _lines(reference, None)
    if change != "format":  # asctime differs between the two runs
        assert mine.getvalue() == theirs.getvalue() != ""
    if change == "filter":
        assert len(records) == len(CALLS)


def test_another_message_goes_through_the_logger() -> None:
    out = FlushCounter()
    target = _uvicorn_logger("test.access.other", out)
    records: list[logging.LogRecord] = []
    target.handlers[0].addFilter(lambda r: records.append(r) or False)  # counted, not written
    line = AccessLine(target)

    async def run() -> None:
        line.info("something %s", "else")

    asyncio.run(run())
    assert [r.getMessage() for r in records] == ["something else"]


def test_a_broken_stream_falls_back_to_the_logger() -> None:
    out = FlushCounter()
    target = _uvicorn_logger("test.access.broken", out)
    line = AccessLine(target)
    _lines(target, line)
    out.close()  # writes now raise ValueError; logging's handler reports its own errors
    logging.raiseExceptions, saved = False, logging.raiseExceptions
    try:
        _lines(target, line)
    finally:
        logging.raiseExceptions = saved
    assert line._stream is None and "failed" in (line.reason or "")
