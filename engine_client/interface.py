"""What the HTTP server needs of an engine client, as a Protocol: the seam for in-process tests.

The server (``pyfront.server``) drives the engines only through these members. `EngineClient` (ZMQ, real
or mock engines) satisfies the protocol, and so does the tests' in-process ``FakeEngine``
(``tests/fakes.py``), which lets HTTP handlers be tested without sockets, threads or engine processes.
Both hand out real `RequestStream` objects, so the server's consumption of outputs (``listen()`` /
``drain()``) is the same code in either case.

The list is exactly what the server uses today; a member the server starts to use belongs here first,
so that the fake cannot fall behind the real client unnoticed (``tests/engine_client/test_fakes.py`` checks both).
Construction and start-up (``EngineClient.start``) are not part of it: each side builds its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from pyfront.engine_client.client import RequestStream
from pyfront.engine_client.protocol import EngineCoreRequest
from pyfront.engine_client.routing import RoutingReport
from pyfront.hashing import PromptHasher

__all__ = ["Engine", "EngineLoad"]


@runtime_checkable
class EngineLoad(Protocol):
    """One engine's load as the server's metrics read it (``EngineClient.engines`` items)."""

    @property
    def num_waiting(self) -> int:
        """Requests queued in the engine's scheduler (from its latest scheduler stats)."""
        ...


@runtime_checkable
class Engine(Protocol):
    """The engine client as the server uses it: send, abort, inspect, close."""

    @property
    def max_model_len(self) -> int:
        """The smallest ``max_model_len`` of the engines (prompt + output must fit); 0 before start-up."""
        ...

    @property
    def healthy(self) -> bool:
        """True while at least one engine can take requests (``/health``, and 503s when False)."""
        ...

    @property
    def hasher(self) -> PromptHasher | None:
        """The front-end block hasher when FEH was negotiated with every engine, else None."""
        ...

    @property
    def num_in_flight(self) -> int:
        """Requests sent and not yet finished or aborted (``/load``, the running-requests gauge)."""
        ...

    @property
    def engines(self) -> Sequence[EngineLoad]:
        """One entry per engine, in rank order."""
        ...

    def health(self) -> dict[str, Any]:
        """The ``/health`` report: ``healthy``, ``degraded_ranks`` (out of service), per-engine status, FEH's state."""
        ...

    def routing_report(self) -> RoutingReport | None:
        """Routing decisions, prediction accuracy and engine loads for ``/metrics`` (None: no routing to report)."""
        ...

    async def add_request(
        self,
        request: EngineCoreRequest,
        *,
        prompt_block_hashes: bytes | None = None,
        trusted: bool = False,
    ) -> RequestStream:
        """Send one request; its outputs arrive, in order, on the returned stream.

        Raises ValueError for a request the engine would refuse (the server checks first, so for the server
        it is a logged 500), `DuplicateRequestError` for an id already in flight, and `EngineError` subclasses
        when no engine can take it.
        """
        ...

    async def abort(self, request_ids: Iterable[str]) -> None:
        """Stop requests: their streams end at once with `RequestAbortedError`; unknown ids are ignored."""
        ...

    async def close(self) -> None:
        """Abort what is in flight and release everything; idempotent."""
        ...
