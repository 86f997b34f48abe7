"""The routing policy (engine_client/routing.py) on constructed cases: load, cache, the cap, the reasons."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pyfront.engine_client.routing import Router, RoutingConfig, RoutingReport, RoutingStats, cached_tokens

BS = 16


@dataclass
class Eng:
    rank: int
    in_flight: int = 0
    healthy: bool = True
    num_waiting: int = 0
    num_running: int = 0
    kv_cache_usage: float = 0.0

    @property
    def num_in_flight(self) -> int:
        return self.in_flight


def router(**kw: float) -> Router:
    return Router(RoutingConfig(**kw))  # type: ignore[arg-type]


def test_cached_tokens_is_capped_as_the_engine_caps_a_hit() -> None:
    assert cached_tokens(4, 64, BS) == 48  # all 4 blocks held, but the last token is always computed
    assert cached_tokens(4, 65, BS) == 64
    assert cached_tokens(2, 65, BS) == 32
    assert cached_tokens(0, 65, BS) == 0
    assert cached_tokens(3, 0, BS) == 0


def test_load_alone_picks_the_lowest_dp_score_and_rotates_ties() -> None:
    r = router()
    engines = [Eng(0, in_flight=3), Eng(1, in_flight=1), Eng(2, in_flight=1)]
    picks = {r.pick(engines).engine.rank for _ in range(6)}  # type: ignore[union-attr]
    assert picks == {1, 2}
    engines = [Eng(0), Eng(1, num_waiting=2, num_running=3)]  # stats count as much as in-flight
    assert r.pick(engines).engine.rank == 0  # type: ignore[union-attr]


def test_no_healthy_engine_is_none() -> None:
    assert router().pick([Eng(0, healthy=False)]) is None
    assert router().pick([]) is None


def test_nothing_cached_anywhere_is_a_load_decision() -> None:
    d = router().pick([Eng(0, in_flight=2), Eng(1)], 1000, [0, 0], BS)
    assert d is not None and d.engine.rank == 1 and d.reason == "load" and d.cached_tokens == 0


def test_the_engine_with_the_longest_prefix_wins_within_the_cap() -> None:
    engines = [Eng(0, in_flight=1), Eng(1, in_flight=2), Eng(2)]
    d = router().pick(engines, 2000, [10, 100, 0], BS)
    assert d is not None and d.engine.rank == 1 and d.reason == "cache" and d.cached_tokens == 1600


def test_load_weight_trades_cached_tokens_for_load() -> None:
    engines = [Eng(0, in_flight=2), Eng(1)]
    # 2 blocks (32 tokens) cached on a busier engine: not worth 2 units of load at 512 tokens each.
    d = router().pick(engines, 2000, [2, 0], BS)
    assert d is not None and d.engine.rank == 1 and d.reason == "load"
    # With a weight of 8 tokens per unit, 32 cached tokens beat 2 units of load (16 tokens).
    d = router(load_weight=8).pick(engines, 2000, [2, 0], BS)
    assert d is not None and d.engine.rank == 0 and d.reason == "cache"


def test_the_imbalance_cap_spills_a_hot_prefix() -> None:
    r = router(max_imbalance=1.25, imbalance_slack=2, load_weight=0)
    # rank 0 holds everything but has 3 more requests than the least loaded: over min + slack = 2.
    engines = [Eng(0, in_flight=3), Eng(1), Eng(2, in_flight=1)]
    d = r.pick(engines, 4000, [200, 0, 5], BS)
    assert d is not None and d.engine.rank == 2 and d.reason == "capped" and d.cached_tokens == 80
    # At min + slack exactly it still competes, and wins.
    engines[0].in_flight = 2
    d = r.pick(engines, 4000, [200, 0, 5], BS)
    assert d is not None and d.engine.rank == 0 and d.reason == "cache"


def test_the_cap_scales_with_load() -> None:
    r = router(max_imbalance=1.25, imbalance_slack=2, load_weight=0)
    engines = [Eng(0, in_flight=25), Eng(1, in_flight=20)]
    d = r.pick(engines, 4000, [100, 0], BS)  # 25 <= 20 * 1.25
    assert d is not None and d.engine.rank == 0
    engines[0].in_flight = 26  # > 25 and > 22
    d = r.pick(engines, 4000, [100, 0], BS)
    assert d is not None and d.engine.rank == 1 and d.reason == "capped"


def test_unhealthy_engines_neither_win_nor_set_the_cap() -> None:
    r = router()
    engines = [Eng(0, healthy=False), Eng(1, in_flight=4), Eng(2, in_flight=5)]
    d = r.pick(engines, 4000, [200, 0, 50], BS)
    assert d is not None and d.engine.rank == 2 and d.reason == "cache"


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="routing policy"):
        RoutingConfig(policy="random")
    with pytest.raises(ValueError):
        RoutingConfig(max_imbalance=0.5)
    assert not RoutingConfig(policy="load").cache_aware


def test_stats_and_report() -> None:
    stats = RoutingStats()
    stats.decided("cache", "events")
    stats.decided("cache", "events")
    stats.checked(128, 128)
    stats.checked(256, 128)
    assert stats.decisions == {("cache", "events"): 2}
    assert (stats.predictions, stats.exact_predictions, stats.abs_error_tokens) == (2, 1, 128)
    from pyfront.engine_client.routing import EngineRouting

    report = RoutingReport("cache", stats, (EngineRouting(0, "engine_hashes", 3, 10), EngineRouting(1, "off", 1, 0)))
    assert report.load_spread == 1.5
    assert RoutingReport("cache", stats, ()).load_spread == 1.0
