"""The event-loop ITL histogram exposes exactly what prometheus_client's Histogram would."""

from __future__ import annotations

import random
import re

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pyfront.server.metrics import _ITL_BUCKETS, Metrics, _LoopHistogram


def _exposition(registry: CollectorRegistry) -> list[str]:
    # _created holds each histogram's own creation time: compare its presence, not its value.
    return [re.sub(r"(_created\{.*\}) .*", r"\1 T", line) for line in generate_latest(registry).decode().splitlines()]


def test_loop_histogram_matches_prometheus_histogram() -> None:
    reference_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    reference = Histogram(
        "vllm:inter_token_latency_seconds", "doc", ["model_name"], buckets=_ITL_BUCKETS, registry=reference_registry
    ).labels("m")
    ours = _LoopHistogram("vllm:inter_token_latency_seconds", "doc", _ITL_BUCKETS, "m")
    ours_registry.register(ours)
    rnd = random.Random(7)
    values = [*_ITL_BUCKETS, 0.0, 1e-9, 1000.0] + [rnd.choice(_ITL_BUCKETS) for _ in range(300)]
    values += [rnd.expovariate(30) for _ in range(3000)]
    for value in values:
        reference.observe(value)
        ours.observe(value)
    assert _exposition(ours_registry) == _exposition(reference_registry)


def test_metrics_uses_the_loop_histogram_in_one_process(monkeypatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics("m", lambda: None)
    metrics.itl.observe(0.02)
    text = metrics.render().decode()
    assert 'vllm:inter_token_latency_seconds_bucket{le="0.02",model_name="m"} 1.0' in text
    assert 'vllm:inter_token_latency_seconds_count{model_name="m"} 1.0' in text
