"""Routing as HTTP clients see it: the X-data-parallel-rank header, /health's routing state, the metrics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import MODEL, Harness, running_harness

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 40}], "max_tokens": 2}


def test_header_rank_in_range_is_served_out_of_range_is_a_400(harness: Harness) -> None:
    with harness.http() as http:
        ok = http.post("/v1/chat/completions", json=BODY, headers={"X-data-parallel-rank": "0"})
        assert ok.status_code == 200, ok.text
        bad = http.post("/v1/chat/completions", json=BODY, headers={"X-data-parallel-rank": "1"})
        assert bad.status_code == 400
        error = bad.json()["error"]
        assert error["message"] == "data_parallel_rank 1 is out of range [0, 1)."
        assert error["param"] == "X-data-parallel-rank"
        negative = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1},
                             headers={"X-data-parallel-rank": "-1"})  # fmt: skip
        assert negative.status_code == 400
        # Not an int: ignored, as vLLM's front end ignores it.
        ignored = http.post("/v1/chat/completions", json=BODY, headers={"X-data-parallel-rank": "zero"})
        assert ignored.status_code == 200


@pytest.fixture(scope="module")
def two_engines(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch_module.setenv("VLLM_NATIVE_FEH", "1")
    with running_harness(ranks=[0, 1]) as running:
        yield running


def test_one_engine_has_nothing_to_route(harness: Harness) -> None:
    """No index, no per-request block keys or lookups: /health says why."""
    with harness.http() as http:
        assert http.post("/v1/chat/completions", json=BODY).status_code == 200
        health = http.get("/health").json()
    assert health["routing"]["policy"] == "cache" and "one engine" in health["routing"]["state"]
    assert health["engines"][0]["routing"]["mode"] == "off"


def test_health_and_metrics_report_routing(two_engines: Harness) -> None:
    harness = two_engines
    with harness.http() as http:
        assert http.post("/v1/chat/completions", json=BODY).status_code == 200
        assert http.post("/v1/chat/completions", json=BODY, headers={"X-data-parallel-rank": "0"}).status_code == 200
        health = http.get("/health").json()
        assert health["routing"]["policy"] == "cache"
        engine = health["engines"][0]["routing"]
        assert engine["mode"] == "approximate" and "no KV events" in engine["reason"]
        metrics = http.get("/metrics").text
    lines = [line for line in metrics.splitlines() if line.startswith("pyfront:routing_decisions_total")]
    explicit = [line for line in lines if 'reason="explicit"' in line]
    assert explicit and float(explicit[0].rsplit(" ", 1)[1]) >= 1
    assert any('source="approximate"' in line or 'reason="load"' in line for line in lines)
    assert 'pyfront:routing_index_mode{engine="0",mode="approximate",model_name=' in metrics
    assert "pyfront:routing_load_spread{" in metrics
    assert "pyfront:routing_predictions_total{" in metrics
