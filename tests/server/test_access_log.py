"""server/access_log.py: the access line written directly is exactly the one uvicorn's logger writes, the lines
are held and written together in one write within FLUSH_AFTER_S (or at exit), and any set-up other than uvicorn's
default goes through the logger unchanged."""

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
        self.writes = 0

    def flush(self) -> None:
        self.flushes += 1

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


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
    assert mine.flushes == 1 and mine.writes == 1  # four lines, one write and one flush, FLUSH_AFTER_S after the first
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


def test_lines_are_held_until_the_flush_and_written_in_one_piece() -> None:
    """Nothing is written per line (under PYTHONUNBUFFERED that was a system call per request); the timer's flush
    writes every held line at once, and `flush` itself (the exit hook) writes what is still held."""
    out = FlushCounter()
    line = AccessLine(_uvicorn_logger("test.access.held", out))

    async def run() -> tuple[str, int]:
        for args in CALLS:
            line.info(UVICORN_ACCESS_MESSAGE, *args)
        before = (out.getvalue(), out.writes)
        await asyncio.sleep(FLUSH_AFTER_S * 3)
        return before

    assert asyncio.run(run()) == ("", 0)
    assert out.writes == 1 and len(out.getvalue().splitlines()) == len(CALLS)

    async def one_more() -> None:
        line.info(UVICORN_ACCESS_MESSAGE, *CALLS[0])

    asyncio.run(one_more())  # the loop ends before the timer: the line is still held
    assert len(out.getvalue().splitlines()) == len(CALLS)
    line.flush()  # what the atexit hook does
    assert out.getvalue().splitlines()[-1] == out.getvalue().splitlines()[0] and out.writes == 2
    line.flush()  # nothing held: nothing written
    assert out.writes == 2


def test_held_lines_go_through_the_logger_when_the_stream_fails() -> None:
    out = FlushCounter()
    target = _uvicorn_logger("test.access.failing", out)
    line = AccessLine(target)
    _lines(target, line)
    records: list[logging.LogRecord] = []
    target.handlers[0].addFilter(lambda r: records.append(r) or False)  # counted, not written
    out.close()
    _lines(target, line)
    assert line._stream is None and "failed" in (line.reason or "")
    assert [r.args for r in records] == CALLS  # none of the held lines is lost
