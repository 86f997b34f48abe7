"""The input ROUTER and output PULL through pyzmq and libzmq: for the addresses `zmtp.py` does not take (inproc,
abstract or wildcard ipc, host names), when its start-up check fails, or when asked for
(``PYFRONT_ENGINE_TRANSPORT=libzmq``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from pyfront.engine_client.codec import Buffer
from pyfront.engine_client.transport.base import (
    OUTPUT_BATCH_MESSAGES,
    OUTPUT_BATCH_SECONDS,
    DisconnectHandler,
    EngineUnreachable,
    OutputHandler,
)

logger = logging.getLogger(__name__)

REGISTRATION_POLL_S = 0.5
"""The input ROUTER's events are checked at least this often for registrations of restarted engines.

Requests are sent on the same socket straight through libzmq (`send`), and such a send may consume the
edge-triggered readiness notification that a registration raised, so waiting for the notification alone
could miss it; a restarted engine needs seconds to start, so half a second more does not matter.
"""

_send_now = zmq.backend.Socket.send
"""The Cython send under pyzmq's ``Socket.send``, called frame by frame with int flags. ``send_multipart`` took
4.0 us for an ADD's three frames against 1.1 us this way (an ``IntFlag.__or__`` per frame, buffer checks, the
sugar's routing_id/group branches); the bytes on the wire are the same."""
_MORE_NOW = int(zmq.SNDMORE | zmq.NOBLOCK)
_NOW = int(zmq.NOBLOCK)


class LibzmqSockets:
    """ROUTER_MANDATORY + ROUTER_HANDOVER input, PULL output, a disconnect monitor; unbounded queues (HWM 0)."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        input_address: str,
        output_address: str,
        on_output: OutputHandler,
        on_disconnect: DisconnectHandler,
        kind: str,
    ) -> None:
        self.kind = kind
        self._input = ctx.socket(zmq.ROUTER)
        self._input_now: zmq.Socket[bytes] = zmq.Socket.shadow(self._input.underlying)
        """The same socket without zmq.asyncio's wrapping, for non-blocking sends."""
        self._input.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A restarted engine registers under its rank's identity; let its connection take the identity over
        # even if the old one has not been noticed as gone (see HandshakeServer).
        self._input.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._input.setsockopt(zmq.SNDHWM, 0)
        self._input.setsockopt(zmq.RCVHWM, 0)
        self._input.setsockopt(zmq.LINGER, 0)
        self._output = ctx.socket(zmq.PULL)
        self._output.setsockopt(zmq.RCVHWM, 0)
        self._output.setsockopt(zmq.LINGER, 0)
        self._monitor: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        try:
            self._input.bind(input_address)
            self._output.bind(output_address)
        except BaseException:
            self._close_sockets()
            raise
        self.input_address = self._input.getsockopt_string(zmq.LAST_ENDPOINT)
        self.output_address = self._output.getsockopt_string(zmq.LAST_ENDPOINT)
        self._monitor = self._input.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._output_loop(on_output), name="pyfront-engine-outputs"),
            loop.create_task(self._monitor_loop(on_disconnect), name="pyfront-engine-monitor"),
        ]

    def send(self, identity: bytes, frames: Sequence[Buffer], *, at_once: bool = False) -> None:
        # Always at once (libzmq's I/O thread does the batching). Straight on the socket, not through zmq.asyncio's
        # send (a future and poller work per message): with SNDHWM 0 a ROUTER send never blocks, so NOBLOCK only
        # ever fails with EHOSTUNREACH (ROUTER_MANDATORY) for an engine that is gone.
        sock = self._input_now
        try:
            _send_now(sock, identity, _MORE_NOW, False)
            last = len(frames) - 1
            for i, frame in enumerate(frames):
                _send_now(sock, frame, _NOW if i == last else _MORE_NOW, False)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise EngineUnreachable(identity) from None
            raise

    async def recv_input(self) -> list[bytes]:
        sock = self._input_now
        while True:
            if cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return sock.recv_multipart(zmq.NOBLOCK)
            await self._input.poll(timeout=REGISTRATION_POLL_S * 1000)

    async def _output_loop(self, on_output: OutputHandler) -> None:
        """Receive engine outputs in bounded batches, without a future per message.

        zmq.asyncio's recv costs a future and a poller registration per message; here the socket's file
        descriptor wakes the loop and non-blocking reads drain it. The descriptor is edge-triggered (it
        signals when zmq's event state changes), so after a read finds nothing the state is checked once
        more before waiting. While messages keep coming, the loop yields after `OUTPUT_BATCH_MESSAGES`
        messages or `OUTPUT_BATCH_SECONDS`: an engine that outputs faster than we route must not starve
        `/health`, disconnect handling and signal handlers of the event loop.
        """
        sock: zmq.Socket[bytes] = zmq.Socket.shadow(self._output.underlying)
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        fd = cast(int, sock.getsockopt(zmq.FD))  # int-valued options come back as int
        loop.add_reader(fd, readable.set)
        recv, noblock, again = sock.recv_multipart, zmq.NOBLOCK, zmq.Again
        clock = time.monotonic
        try:
            while True:
                budget_end = clock() + OUTPUT_BATCH_SECONDS
                for _ in range(OUTPUT_BATCH_MESSAGES):
                    try:
                        frames = recv(noblock)
                    except again:
                        readable.clear()
                        if cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                            continue
                        await readable.wait()
                        break  # the wait yielded: a fresh batch
                    try:
                        on_output(frames)
                    except Exception:  # one bad message must not stop the outputs of every other request
                        logger.exception("routing an engine output failed")
                    if clock() >= budget_end:
                        await asyncio.sleep(0)
                        break
                else:
                    await asyncio.sleep(0)
        finally:
            loop.remove_reader(fd)

    async def _monitor_loop(self, on_disconnect: DisconnectHandler) -> None:
        assert self._monitor is not None
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                endpoint = event.get("endpoint")
                on_disconnect(endpoint.decode(errors="replace") if isinstance(endpoint, bytes) else str(endpoint))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._close_sockets()

    def _close_sockets(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._input.disable_monitor()
        for sock in (self._monitor, self._input, self._output):
            if sock is not None:
                sock.close(linger=0)
