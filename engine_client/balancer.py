"""Pick the engine for a new request: vLLM's DP load-balancing score over this front end's view.

score = max(client_count * in_flight, waiting + running), plus a penalty for queued work on an engine
whose KV cache is more than half full (vLLM 0.32 `DPLBAsyncMPClient`). `in_flight` is this process's
own unfinished requests on the engine (exact, updated at once); waiting/running come from the
scheduler stats in the engine's outputs (one step old). The scan starts one engine further on each
pick, so ties rotate instead of piling onto rank 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Routable(Protocol):
    rank: int
    healthy: bool
    num_waiting: int
    num_running: int
    kv_cache_usage: float

    @property
    def num_in_flight(self) -> int: ...


R = TypeVar("R", bound=Routable)


class LoadBalancer:
    def __init__(self, client_index: int = 0, client_count: int = 1) -> None:
        self.client_count = client_count
        self._start = client_index
        self._next_start = 0

    def score(self, engine: Routable) -> float:
        waiting = engine.num_waiting
        score: float = max(self.client_count * engine.num_in_flight, waiting + engine.num_running)
        if waiting > 0:
            score += waiting * 6 * max(0.0, engine.kv_cache_usage - 0.5)
        return score

    def pick(self, engines: Sequence[R]) -> R | None:
        """The healthy engine with the lowest score, or None if no engine is healthy."""
        count = len(engines)
        if count == 0:
            return None
        start = (self._start + self._next_start) % count
        self._next_start += 1
        best: R | None = None
        best_score = 0.0
        for offset in range(count):
            engine = engines[(start + offset) % count]
            if not engine.healthy:
                continue
            score = self.score(engine)
            if best is None or score < best_score:
                best, best_score = engine, score
        return best
