"""Prometheus metrics under vLLM's names, plus pyfront's front-end block hashing counters.

Updated once per engine output (not per token) on the streaming path. When PROMETHEUS_MULTIPROC_DIR
is set (several API server processes), prometheus_client's multiprocess mode adds the processes up.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any, Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from pyfront.engine_client.routing import RoutingReport
from pyfront.hashing import MemoStats

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class _LoopHistogram(Collector):
    """A histogram observed on the event loop (per engine output, per request), counted in plain ints and exposed at
    scrape time.

    prometheus_client's Histogram takes a lock and walks its buckets on every observe (0.76 against 0.16 us here;
    for the ITL, 5% of the front end's CPU per streamed token). Observations here come from the event loop only,
    so a bisect and two additions suffice. Single process only: with PROMETHEUS_MULTIPROC_DIR the
    shared-memory Histogram is used instead, so the processes add up.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], model: str) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = list(buckets)
        self._model = model
        self._counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._created = time.time()

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=["model_name"])
        cumulative, buckets = 0, []
        for bound, count in zip([*self._bounds, float("inf")], self._counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric([self._model], buckets, self._sum)
        family.samples.append(Sample(f"{self._name}_created", {"model_name": self._model}, self._created))
        yield family


class _LoopCount:
    """One child of a :class:`_LoopCounter`: its value and creation time."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class _LoopCounter(Collector):
    """A counter incremented on the event loop (per request), counted in plain floats and exposed at scrape time, as
    :class:`_LoopHistogram` is and for the same reason: prometheus_client's Counter takes a lock and checks that it
    is observable on every ``inc`` (0.37 against 0.08 us here; four a request). Exposed exactly as a Counter with
    labels ``model_name`` (+ ``label``) would be: ``_total`` and ``_created`` per child, children in the order they
    were made. Single process only (see :class:`_LoopHistogram`).
    """

    def __init__(self, name: str, documentation: str, model: str, label: str | None = None) -> None:
        self._name = name
        self._documentation = documentation
        self._model = model
        self._labels = ["model_name"] if label is None else ["model_name", label]
        self._children: dict[str, _LoopCount] = {}

    def labels(self, value: str = "") -> _LoopCount:
        """The child for ``label``'s value ("" for a counter without a label); made at the first call, as a
        Counter's."""
        child = self._children.get(value)
        if child is None:
            child = self._children[value] = _LoopCount()
        return child

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labels)
        for value, child in self._children.items():
            family.add_metric([self._model, value][: len(self._labels)], child.value, created=child.created)
        yield family


class _MemoCollector(Collector):
    """Reads the hash memo's counters at scrape time (they live in the memo, not in prometheus)."""

    def __init__(self, stats: Callable[[], MemoStats | None], model: str) -> None:
        self._stats = stats
        self._model = model

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._stats() or MemoStats()
        labels = ["model_name"]
        for name, doc, value in (
            ("pyfront:feh_memo_requests", "Prompts looked up in the block-hash memo", stats.requests),
            ("pyfront:feh_memo_hits", "Prompts that reused an earlier prompt's block hashes", stats.hits),
            ("pyfront:feh_blocks", "Full prompt blocks of hashed prompts", stats.blocks_total),
            (
                "pyfront:feh_blocks_hashed",
                "Blocks actually hashed (the rest came from the memo)",
                stats.blocks_hashed,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric([self._model], value)
            yield family
        entries = GaugeMetricFamily("pyfront:feh_memo_entries", "Prompts held in the block-hash memo", labels=labels)
        entries.add_metric([self._model], stats.entries)
        yield entries


class _SegmentCollector(Collector):
    """The chat tokenization cache's counters, read at scrape time."""

    def __init__(self, stats: Callable[[], Any], model: str) -> None:
        self._stats = stats
        self._model = model

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = self._stats()
        if stats is None:
            return
        for field, doc in (
            ("segments", "Text segments of chat prompts looked up in the tokenization cache"),
            ("segment_hits", "Segments whose token ids came from the cache"),
            ("tokens_from_cache", "Prompt tokens taken from the tokenization cache"),
            ("tokens_encoded", "Prompt tokens tokenized afresh"),
        ):
            family = CounterMetricFamily(f"pyfront:tokenize_{field}", doc, labels=["model_name"])
            family.add_metric([self._model], getattr(stats, field))
            yield family


class _RoutingCollector(Collector):
    """Routing decisions, how well the prefix index predicted the engines' cache hits, and engine loads.

    Read at scrape time from the engine client (`EngineClient.routing_report`): the counters live there,
    updated once per request on the event loop.
    """

    def __init__(self, report: Callable[[], RoutingReport | None], model: str) -> None:
        self._report = report
        self._model = model

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        report = self._report()
        if report is None:
            return
        model = self._model
        stats = report.stats
        decisions = CounterMetricFamily(
            "pyfront:routing_decisions",
            "Requests routed to an engine, by reason (cache, capped, load, explicit) and by where the chosen "
            "engine's prefix knowledge came from (events, approximate, none)",
            labels=["model_name", "reason", "source"],
        )
        for (reason, source), count in sorted(stats.decisions.items()):
            decisions.add_metric([model, reason, source], count)
        yield decisions
        for name, doc, value in (
            (
                "pyfront:routing_predicted_cached_tokens",
                "Prompt tokens routing predicted cached",
                stats.predicted_tokens,
            ),
            (
                "pyfront:routing_reported_cached_tokens",
                "Prompt tokens the engines reported cached (num_cached_tokens) for the same requests",
                stats.reported_tokens,
            ),
            (
                "pyfront:routing_prediction_error_tokens",
                "Sum of |reported - predicted| cached prompt tokens",
                stats.abs_error_tokens,
            ),
            ("pyfront:routing_predictions", "Routed requests whose prediction was checked", stats.predictions),
            ("pyfront:routing_exact_predictions", "... of which the prediction was exact", stats.exact_predictions),
        ):
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([model], value)
            yield family
        spread = GaugeMetricFamily(
            "pyfront:routing_load_spread",
            "The most loaded healthy engine's DP load score over the mean (1: even)",
            labels=["model_name"],
        )
        spread.add_metric([model], report.load_spread)
        yield spread
        load = GaugeMetricFamily(
            "pyfront:routing_engine_load", "Each engine's DP load score", labels=["model_name", "engine"]
        )
        blocks = GaugeMetricFamily(
            "pyfront:routing_index_blocks", "Blocks the prefix index holds per engine", labels=["model_name", "engine"]
        )
        mode = GaugeMetricFamily(
            "pyfront:routing_index_mode",
            "1 for each engine's prefix-index mode (engine_hashes, verifying, recomputed, approximate, off)",
            labels=["model_name", "engine", "mode"],
        )
        for engine in report.engines:
            rank = str(engine.rank)
            load.add_metric([model, rank], engine.load)
            blocks.add_metric([model, rank], engine.blocks)
            mode.add_metric([model, rank, engine.mode], 1)
        yield load
        yield blocks
        yield mode


class Metrics:
    def __init__(
        self,
        model_name: str,
        memo_stats: Callable[[], MemoStats | None],
        segment_stats: Callable[[], Any] | None = None,
        routing_report: Callable[[], RoutingReport | None] | None = None,
    ) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        multiproc = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r = self.registry
        labels = ["model_name"]
        gauge_mode: dict[str, Literal["livesum"]] = {"multiprocess_mode": "livesum"} if multiproc else {}
        self.running = Gauge("vllm:num_requests_running", "Requests in flight in the engines", labels, registry=r,
                             **gauge_mode).labels(model_name)  # fmt: skip
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting in the engines", labels, registry=r,
                             **gauge_mode).labels(model_name)  # fmt: skip

        def counter(name: str, documentation: str, label: str | None = None) -> Any:
            """Incremented on the event loop: plain floats in one process, shared memory across several. Returns
            the metric itself with a `label`, else its one child."""
            if multiproc:
                metric = Counter(name, documentation, labels if label is None else [*labels, label], registry=r)
                return metric.labels(model_name) if label is None else metric
            loop_counter = _LoopCounter(name, documentation, model_name, label)
            r.register(loop_counter)
            return loop_counter.labels() if label is None else loop_counter

        self.success = counter("vllm:request_success", "Finished requests by finish reason", "finished_reason")
        self._success_by_reason: dict[str, Any] = {}
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens")

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram | _LoopHistogram:
            """Observed on the event loop: counted in plain ints in one process, shared memory across several."""
            if multiproc:
                return Histogram(name, documentation, labels, buckets=buckets, registry=r).labels(model_name)
            loop_histogram = _LoopHistogram(name, documentation, buckets, model_name)
            r.register(loop_histogram)
            return loop_histogram

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token", _LATENCY_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between engine outputs of a request",
                             _ITL_BUCKETS)  # fmt: skip
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Request latency, arrival to finish", _E2E_BUCKETS)
        self.request_errors = Counter("pyfront:request_errors", "Requests answered with an error, by status",
                                      [*labels, "status"], registry=r)  # fmt: skip
        self.feh_requests = counter("pyfront:feh_requests", "Requests sent with or without front-end block hashes",
                                    "hashed")  # fmt: skip
        self._feh_by_hashed: dict[bool, Any] = {}
        self.rejected = Counter(
            "pyfront:requests_rejected", "Requests refused before reaching an engine, by reason",
            [*labels, "reason"], registry=r,
        )  # fmt: skip
        self.write_waits = Counter(
            "pyfront:stream_write_waits", "Streamed writes that waited for a slow client (flow control)", labels,
            registry=r,
        ).labels(model_name)  # fmt: skip
        self._memo_gauges: dict[str, Gauge] | None = None
        if multiproc:
            # Collectors cannot read other processes' memos: each process publishes its own counters.
            self._memo_gauges = {
                field: Gauge(name, doc, labels, registry=r, multiprocess_mode="livesum").labels(model_name)
                for field, name, doc in (
                    ("requests", "pyfront:feh_memo_requests_total", "Prompts looked up in the block-hash memo"),
                    ("hits", "pyfront:feh_memo_hits_total", "Prompts that reused an earlier prompt's block hashes"),
                    ("blocks_total", "pyfront:feh_blocks_total", "Full prompt blocks of hashed prompts"),
                    ("blocks_hashed", "pyfront:feh_blocks_hashed_total", "Blocks actually hashed"),
                    ("entries", "pyfront:feh_memo_entries", "Prompts held in the block-hash memo"),
                )
            }
        else:
            r.register(_MemoCollector(memo_stats, model_name))
            if segment_stats is not None:
                r.register(_SegmentCollector(segment_stats, model_name))
            if routing_report is not None:
                r.register(_RoutingCollector(routing_report, model_name))
        self._memo_stats = memo_stats

    def publish_memo(self) -> None:
        """Multiprocess mode only: copy this process's memo counters into the shared gauges."""
        if self._memo_gauges is None:
            return
        stats = self._memo_stats()
        if stats is not None:
            for field, gauge in self._memo_gauges.items():
                gauge.set(getattr(stats, field))

    def finished(self, reason: str) -> None:
        child = self._success_by_reason.get(reason)
        if child is None:  # a closed set (vLLM's finish reasons): labels() once per reason, not per request
            child = self._success_by_reason[reason] = self._child(self.success, reason)
        child.inc()

    def _child(self, metric: Any, value: str) -> Any:
        """The child of a labelled counter (a Counter's or a _LoopCounter's) for the model and `value`."""
        return metric.labels(value) if isinstance(metric, _LoopCounter) else metric.labels(self.model_name, value)

    def sent(self, hashed: bool) -> None:
        """An engine request left, with front-end block hashes or without."""
        child = self._feh_by_hashed.get(hashed)
        if child is None:  # labels() once per value (1.3 us a call), and only once it occurs, as before
            child = self._feh_by_hashed[hashed] = self._child(self.feh_requests, str(hashed).lower())
        child.inc()

    def error(self, status: int) -> None:
        self.request_errors.labels(self.model_name, str(status)).inc()

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
