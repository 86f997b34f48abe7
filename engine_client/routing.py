"""Pick the engine for a new request: the routing policy, in one place.

Load (``--routing load``, and every request when nothing is cached anywhere): vLLM 0.32's DP score,
``max(client_count * in_flight, waiting + running)`` plus a penalty for queued work on an engine whose KV cache
is more than half full (``DPLBAsyncMPClient``). ``in_flight`` is this process's own unfinished requests on
the engine (exact, updated at once); waiting/running come from the scheduler stats in the engine's outputs
(one step old). The scan starts one engine further on each pick, so ties rotate instead of piling onto
rank 0.

Cache (``--routing cache``, the default): the expected cost of sending the request to engine e is

    cost(e) = (prompt_tokens - cached_tokens(e)) + load_weight * score(e)

the prefill e would still have to do, in tokens, plus its load, at ``--routing-load-weight`` tokens per unit of
the DP score (an engine with one more request queued must save that many prompt tokens to be preferred).
``cached_tokens(e)`` is the longest prefix of the prompt's blocks that the prefix index says e holds, capped as
the engine caps a hit (at least the last prompt token is always computed). Only engines within the
imbalance cap compete: ``score(e) <= max(min_score + slack, min_score * max_imbalance)`` over the healthy
engines, so a hot prefix spills to other engines once its engine is that much busier than the least loaded
(``--routing-max-imbalance``, ``--routing-imbalance-slack``).

An explicit rank (``X-data-parallel-rank``, or ``data_parallel_rank`` in the request) is taken as given; the
caller checks it (`EngineClient.add_request`).

Reasons, one per decision, for the metrics: ``explicit``; ``cache`` (the chosen engine holds the longest
cached prefix, > 0); ``capped`` (an engine with a longer prefix was over the cap); ``load`` (nothing cached
anywhere, or the load term outweighed the cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

ROUTING_POLICIES = ("cache", "load")


class Routable(Protocol):
    rank: int
    healthy: bool
    num_waiting: int
    num_running: int
    kv_cache_usage: float

    @property
    def num_in_flight(self) -> int: ...


R = TypeVar("R", bound=Routable)


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    policy: str = "cache"
    load_weight: float = 512.0
    """Prompt tokens one unit of the DP load score is worth."""
    max_imbalance: float = 1.25
    imbalance_slack: float = 8.0
    """Load units above the least loaded engine that are always within the cap. Measured
    (benchmarks/routing.py, DP=4, 64 conversations): at 2, one decision in eight was capped at only 2-5
    requests in flight per engine and re-prefilled a 10-30k-token history elsewhere (TTFT p99 3.7x the
    oracle's); at 8 the hit rate and p99 equal the oracle's with a request spread of 1.13."""
    index_max_blocks: int = 1 << 18
    """Per engine (see prefix_index's bound)."""
    silence_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.policy not in ROUTING_POLICIES:
            raise ValueError(f"routing policy must be one of {ROUTING_POLICIES}, got {self.policy!r}")
        if self.load_weight < 0 or self.max_imbalance < 1 or self.imbalance_slack < 0:
            raise ValueError("routing: load_weight >= 0, max_imbalance >= 1 and imbalance_slack >= 0")

    @property
    def cache_aware(self) -> bool:
        return self.policy == "cache"


@dataclass(frozen=True, slots=True)
class Decision(Generic[R]):
    engine: R
    reason: str
    cached_tokens: int
    """The chosen engine's predicted cached prompt tokens (0 when routed on load alone)."""


def cached_tokens(prefix_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """Tokens an engine holding `prefix_blocks` leading blocks will report cached: it always computes the last token."""
    if prompt_tokens <= 0:
        return 0
    return min(prefix_blocks, (prompt_tokens - 1) // block_size) * block_size


class Router:
    def __init__(self, config: RoutingConfig, client_index: int = 0, client_count: int = 1) -> None:
        self.config = config
        self.client_count = client_count
        self._start = client_index
        self._next_start = 0

    def score(self, engine: Routable) -> float:
        """vLLM's DP load score of one engine."""
        waiting = engine.num_waiting
        score: float = max(self.client_count * engine.num_in_flight, waiting + engine.num_running)
        if waiting > 0:
            score += waiting * 6 * max(0.0, engine.kv_cache_usage - 0.5)
        return score

    def _rotation(self, engines: Sequence[R]) -> list[R]:
        count = len(engines)
        start = (self._start + self._next_start) % count
        self._next_start += 1
        return [engines[(start + offset) % count] for offset in range(count)]

    def pick(
        self,
        engines: Sequence[R],
        prompt_tokens: int = 0,
        prefix_blocks: Sequence[int] | None = None,
        block_size: int = 1,
    ) -> Decision[R] | None:
        """The engine for a request (None if no engine is healthy).

        `prefix_blocks[rank]`: the leading prompt blocks each engine holds (None: route on load alone).
        """
        if not engines:
            return None
        if len(engines) == 1 and prefix_blocks is None:  # what the general case gives, without its lists
            return Decision(engines[0], "load", 0) if engines[0].healthy else None
        order = [e for e in self._rotation(engines) if e.healthy]
        if not order:
            return None
        scores = {e.rank: self.score(e) for e in order}
        if prefix_blocks is None or not any(prefix_blocks[e.rank] for e in order):
            best = min(order, key=lambda e: scores[e.rank])  # min keeps the first of equals: the rotation
            return Decision(best, "load", 0)
        cfg = self.config
        lowest = min(scores.values())
        cap = max(lowest + cfg.imbalance_slack, lowest * cfg.max_imbalance)
        cached = {e.rank: cached_tokens(prefix_blocks[e.rank], prompt_tokens, block_size) for e in order}
        eligible = [e for e in order if scores[e.rank] <= cap]
        best = min(eligible, key=lambda e: (prompt_tokens - cached[e.rank]) + cfg.load_weight * scores[e.rank])
        most = max(cached.values())
        if cached[best.rank] == most and most > 0:
            reason = "cache"
        elif any(cached[e.rank] > cached[best.rank] for e in order if scores[e.rank] > cap):
            reason = "capped"
        else:
            reason = "load"
        return Decision(best, reason, cached[best.rank])


@dataclass(slots=True)
class Prediction:
    """What the router expected of one request, checked when its first output reports num_cached_tokens."""

    rank: int
    cached_tokens: int
    stored_from_tokens: int
    """Tokens in the prompt's full blocks: a reported cache hit below this means the engine stored new blocks."""
    source: str
    """The chosen engine's index mode then (``events`` or ``approximate``)."""
    batches_before: int = 0
    """KV event batches received from the engine when the request was routed (see expect_events)."""


class RoutingStats:
    """Counters for the metrics (read at scrape time); updated on the event loop only."""

    def __init__(self) -> None:
        self.decisions: dict[tuple[str, str], int] = {}
        """(reason, source) -> count; source is ``events``, ``approximate`` or ``none``."""
        self.predicted_tokens = 0
        self.reported_tokens = 0
        self.predictions = 0
        self.exact_predictions = 0
        self.abs_error_tokens = 0

    def decided(self, reason: str, source: str) -> None:
        key = (reason, source)
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def checked(self, predicted: int, reported: int) -> None:
        self.predictions += 1
        self.predicted_tokens += predicted
        self.reported_tokens += reported
        error = abs(reported - predicted)
        self.abs_error_tokens += error
        if error == 0:
            self.exact_predictions += 1


@dataclass(frozen=True, slots=True)
class EngineRouting:
    """One engine as the routing metrics show it."""

    rank: int
    mode: str
    """The prefix index's mode for it (``engine_hashes``, ``recomputed``, ``approximate``, ...; ``off``)."""
    load: float
    """Its DP load score now."""
    blocks: int


@dataclass(frozen=True, slots=True)
class RoutingReport:
    policy: str
    stats: RoutingStats
    engines: tuple[EngineRouting, ...]

    @property
    def load_spread(self) -> float:
        """Most loaded healthy engine's score over the mean (1.0: even; 1.0 too when nothing runs)."""
        loads = [e.load for e in self.engines]
        mean = sum(loads) / len(loads) if loads else 0.0
        return max(loads) / mean if mean > 0 else 1.0
