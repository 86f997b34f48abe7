"""The event loop's histograms (ITL, TTFT, end-to-end) expose exactly what prometheus_client's Histogram would."""

from __future__ import annotations

import random
import re

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pyfront.server.metrics import _E2E_BUCKETS, _ITL_BUCKETS, _LATENCY_BUCKETS, Metrics, _LoopHistogram


def _exposition(registry: CollectorRegistry) -> list[str]:
    # _created holds each histogram's own creation time: compare its presence, not its value.
    return [re.sub(r"(_created\{.*\}) .*", r"\1 T", line) for line in generate_latest(registry).decode().splitlines()]


@pytest.mark.parametrize(
    ("name", "buckets"),
    [
        ("vllm:inter_token_latency_seconds", _ITL_BUCKETS),
        ("vllm:time_to_first_token_seconds", _LATENCY_BUCKETS),
        ("vllm:e2e_request_latency_seconds", _E2E_BUCKETS),
    ],
)
def test_loop_histogram_matches_prometheus_histogram(name: str, buckets: tuple[float, ...]) -> None:
    reference_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    reference = Histogram(name, "doc", ["model_name"], buckets=buckets, registry=reference_registry).labels("m")
    ours = _LoopHistogram(name, "doc", buckets, "m")
    ours_registry.register(ours)
    rnd = random.Random(7)
    values = [*buckets, 0.0, 1e-9, 1000.0, 1e5] + [rnd.choice(buckets) for _ in range(300)]
    values += [rnd.expovariate(30) for _ in range(3000)]
    for value in values:
        reference.observe(value)
        ours.observe(value)
    assert _exposition(ours_registry) == _exposition(reference_registry)


def test_metrics_uses_the_loop_histogram_in_one_process(monkeypatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics("m", lambda: None)
    metrics.itl.observe(0.02)
    metrics.ttft.observe(0.04)
    metrics.e2e.observe(1.0)
    assert all(isinstance(h, _LoopHistogram) for h in (metrics.itl, metrics.ttft, metrics.e2e))
    text = metrics.render().decode()
    assert 'vllm:inter_token_latency_seconds_bucket{le="0.02",model_name="m"} 1.0' in text
    assert 'vllm:inter_token_latency_seconds_count{model_name="m"} 1.0' in text
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.04",model_name="m"} 1.0' in text
    assert 'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 1.0' in text


def test_feh_requests_appear_per_value_once_sent(monkeypatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics("m", lambda: None)
    assert "pyfront:feh_requests_total{" not in metrics.render().decode()
    metrics.sent(True)
    metrics.sent(True)
    text = metrics.render().decode()
    assert 'pyfront:feh_requests_total{hashed="true",model_name="m"} 2.0' in text
    assert 'hashed="false"' not in text
    metrics.sent(False)
    assert 'pyfront:feh_requests_total{hashed="false",model_name="m"} 1.0' in metrics.render().decode()
