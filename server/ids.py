"""Request ids: the id a response carries, and the engine request id that must be unique."""

from __future__ import annotations

import os
import random
import uuid


def base_request_id(header_id: str | None, body_id: str | None) -> str:
    """The client's id, else a uuid4 from the OS's randomness: response ids also name stored responses
    (``GET /v1/responses/{id}``), so they must not be guessable."""
    return header_id or body_id or uuid.uuid4().hex


class EngineRequestIds:
    """Engine request ids: the base id plus 32 random bits, unique among in-flight requests even when a client
    reuses its id (a duplicate kills the engine; ``EngineClient.add_request`` refuses one within this process).

    The bits are what ``secrets.token_hex(4)`` gave, drawn from a generator seeded once from the OS instead of one
    ``urandom`` system call per request (~1.5 % of a short request's CPU): they need to differ, not to be secret, as
    no route takes an engine request id. One per process (``ServingState.engine_ids``); a forked child reseeds.
    """

    __slots__ = ("_bits",)

    def __init__(self) -> None:
        rng = random.Random(os.urandom(32))
        os.register_at_fork(after_in_child=lambda: rng.seed(os.urandom(32)))
        self._bits = rng.getrandbits

    def __call__(self, base: str) -> str:
        return f"{base}-{self._bits(32):08x}"
