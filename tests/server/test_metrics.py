"""The event loop's histograms (ITL, TTFT, end-to-end) and counters expose exactly what prometheus_client's Histogram
and Counter would."""

from __future__ import annotations

import random
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from pyfront.server.metrics import (
    _E2E_BUCKETS,
    _ITL_BUCKETS,
    _LATENCY_BUCKETS,
    Metrics,
    _LoopCount,
    _LoopCounter,
    _LoopHistogram,
)


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


def test_loop_counter_matches_prometheus_counter() -> None:
    reference_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    plain_reference = Counter("vllm:prompt_tokens", "doc", ["model_name"], registry=reference_registry).labels("m")
    labelled_reference = Counter("vllm:request_success", "doc", ["model_name", "finished_reason"],
                                 registry=reference_registry)  # fmt: skip
    plain, labelled = _LoopCounter("vllm:prompt_tokens", "doc", "m"), _LoopCounter("vllm:request_success", "doc",
                                                                                   "m", "finished_reason")  # fmt: skip
    ours_registry.register(plain)
    ours_registry.register(labelled)
    plain_child = plain.labels()  # made with the metric, as Metrics makes it (and the reference's child above)
    assert _exposition(ours_registry) == _exposition(reference_registry)  # nothing counted: no child with a label
    rnd = random.Random(3)
    for _ in range(500):
        amount = rnd.choice([1, 7, 4096, 0.5])
        plain_reference.inc(amount)
        plain_child.inc(amount)
        reason = rnd.choice(["stop", "length", "abort"])
        labelled_reference.labels("m", reason).inc()
        labelled.labels(reason).inc()
    assert _exposition(ours_registry) == _exposition(reference_registry)


def test_metrics_uses_loop_counters_in_one_process(monkeypatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics("m", lambda: None)
    assert isinstance(metrics.prompt_tokens, _LoopCount) and isinstance(metrics.generation_tokens, _LoopCount)
    metrics.prompt_tokens.inc(12)
    metrics.generation_tokens.inc(3)
    metrics.finished("stop")
    metrics.finished("stop")
    text = metrics.render().decode()
    assert 'vllm:prompt_tokens_total{model_name="m"} 12.0' in text
    assert 'vllm:generation_tokens_total{model_name="m"} 3.0' in text
    assert 'vllm:request_success_total{finished_reason="stop",model_name="m"} 2.0' in text


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
