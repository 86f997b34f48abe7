"""The engine client's sockets: ZMTP on the event loop (`zmtp.py`) where it can, else libzmq (`libzmq.py`).

`open_engine_sockets` picks one, binds it and starts it. ``PYFRONT_ENGINE_TRANSPORT`` chooses: ``auto`` (the
default: ZMTP when it takes both addresses and passes its start-up check, else libzmq with the reason logged),
``zmtp`` (ZMTP or an error) or ``libzmq``.

The start-up check proves the one thing the ZMTP code cannot prove alone: that the libzmq the engines run talks to
it. pyfront's own libzmq (pyzmq's) connects a DEALER and a PUSH, as vLLM's engines do, to a throwaway pair of our
sockets of the engines' kind (ipc in a temporary directory when their addresses are ipc, so the check takes no TCP
port; else TCP on loopback); a registration-sized message goes each way, a long frame (a 64-bit size) comes back,
and an output arrives. It takes a few milliseconds; any failure or a second without an answer means libzmq for
this run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Mapping

import zmq
import zmq.asyncio

from pyfront.engine_client.transport.base import (
    DisconnectHandler,
    EngineSockets,
    EngineUnreachable,
    OutputHandler,
)
from pyfront.engine_client.transport.libzmq import LibzmqSockets
from pyfront.engine_client.transport.zmtp import ZmtpSockets, parse_address

__all__ = ["EngineSockets", "EngineUnreachable", "open_engine_sockets", "transport_choice"]

logger = logging.getLogger(__name__)

TRANSPORT_ENV = "PYFRONT_ENGINE_TRANSPORT"
CHOICES = ("auto", "zmtp", "libzmq")
CHECK_TIMEOUT_S = 1.0


def transport_choice(environ: Mapping[str, str] = os.environ) -> str:
    choice = environ.get(TRANSPORT_ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{TRANSPORT_ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    return choice


async def open_engine_sockets(
    ctx: zmq.asyncio.Context,
    input_address: str,
    output_address: str,
    on_output: OutputHandler,
    on_disconnect: DisconnectHandler,
    choice: str | None = None,
) -> EngineSockets:
    """The bound, running input ROUTER and output PULL; which transport and why is logged and in `.kind`."""
    choice = transport_choice() if choice is None else choice
    if choice == "libzmq":
        return LibzmqSockets(ctx, input_address, output_address, on_output, on_disconnect, f"libzmq ({TRANSPORT_ENV})")
    try:
        kind = parse_address(input_address)[0]
        parse_address(output_address)
        problem = await check_against_libzmq(ctx, kind)
    except ValueError as exc:
        problem = str(exc)
    if problem is None:
        sockets: EngineSockets = await ZmtpSockets.open(
            input_address, output_address, on_output, on_disconnect, "zmtp (on the event loop)"
        )
        logger.info("engine sockets: ZMTP on the event loop (%s, %s)", sockets.input_address, sockets.output_address)
        return sockets
    if choice == "zmtp":
        raise ValueError(f"{TRANSPORT_ENV}=zmtp, but {problem}")
    logger.warning("engine sockets: libzmq, not ZMTP on the event loop: %s", problem)
    return LibzmqSockets(ctx, input_address, output_address, on_output, on_disconnect, f"libzmq ({problem})")


async def check_against_libzmq(ctx: zmq.asyncio.Context, kind: str = "tcp") -> str | None:
    """None if pyzmq's libzmq and `zmtp.py` exchange messages as engines and pyfront do, over `kind` ("ipc" or
    "tcp") sockets; else what went wrong.

    ipc sockets go in a temporary directory: a TCP port 0 taken for a moment during start-up can be the very port a
    test (or a script that picks free ports the same way) chose for the HTTP server, which then fails to bind.
    """
    if kind != "ipc":
        return await _check(ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    with tempfile.TemporaryDirectory(prefix="pyfront-check-") as tmp:
        return await _check(ctx, f"ipc://{tmp}/in", f"ipc://{tmp}/out")


async def _check(ctx: zmq.asyncio.Context, input_address: str, output_address: str) -> str | None:
    outputs: asyncio.Queue[list[bytes]] = asyncio.Queue()
    sockets = await ZmtpSockets.open(input_address, output_address, outputs.put_nowait, _ignore, "check")
    dealer = ctx.socket(zmq.DEALER)
    push = ctx.socket(zmq.PUSH)
    try:
        identity = b"\x07\x00"
        dealer.setsockopt(zmq.IDENTITY, identity)
        for sock in (dealer, push):
            sock.setsockopt(zmq.LINGER, 0)
        dealer.connect(sockets.input_address)
        push.connect(sockets.output_address)
        registration = [b"", b"r" * 300]
        big = os.urandom(70_000)
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            await dealer.send_multipart(registration)
            if await sockets.recv_input() != [identity, *registration]:
                return "the start-up check read a libzmq DEALER's message wrongly"
            sockets.send(identity, [b"\x00", big, b""])
            if await dealer.recv_multipart() != [b"\x00", big, b""]:
                return "libzmq read the start-up check's message wrongly"
            await push.send_multipart([b"o", b"p" * 300])
            if await outputs.get() != [b"o", b"p" * 300]:
                return "the start-up check read a libzmq PUSH's message wrongly"
    except TimeoutError:
        return f"the start-up check against libzmq {zmq.zmq_version()} got no answer within {CHECK_TIMEOUT_S:g}s"
    except (OSError, zmq.ZMQError, EngineUnreachable) as exc:
        return f"the start-up check against libzmq {zmq.zmq_version()} failed: {exc}"
    finally:
        dealer.close(0)
        push.close(0)
        await sockets.close()
    return None


def _ignore(endpoint: str) -> None:
    """The check's sockets report no disconnects."""
