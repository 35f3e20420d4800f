"""The engine's /metrics: Prometheus exposition built by prometheus_client from `StepStats`.

Names are SGLang's where the meaning is the same (`sglang:num_running_reqs`,
`sglang:gen_throughput`, `sglang:spec_accept_length`, `sglang:generation_tokens_total`, ...),
so dashboards made for the SGLang service read the reference engine too; what SGLang lacks is
`ddtree:` (decode steps by batch size, the per-stage and accept-length histograms). Every
sample carries `model_name`; stage histograms add `stage`, one series per name in `STAGES`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from engine.stats import STAGES, Histogram, StepStats


def _gauge(name: str, help_: str, model: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, help_, labels=["model_name"])
    g.add_metric([model], float(value))
    return g


def _counter(name: str, help_: str, model: str, value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(name, help_, labels=["model_name"])  # exposed as NAME_total
    c.add_metric([model], float(value))
    return c


def _add(fam: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    buckets, total = h.snapshot()
    fam.add_metric(labels, [(floatToGoString(b), c) for b, c in buckets], sum_value=total)


class EngineCollector(Collector):
    """One scrape: the scheduler's queue, then `StepStats` read under its lock."""

    def __init__(self, stats: StepStats, model: str, running: int, queued: int) -> None:
        self.stats, self.model, self.running, self.queued = stats, model, running, queued

    def collect(self) -> Iterator[Metric]:
        st, model = self.stats, self.model
        yield _gauge(
            "sglang:num_running_reqs", "Requests in the running batch.", model, self.running
        )
        yield _gauge(
            "sglang:num_queue_reqs", "Requests waiting to join the batch.", model, self.queued
        )
        yield _gauge(
            "sglang:gen_throughput",
            "Generated tokens per second (last 10 s).",
            model,
            st.throughput(),
        )
        yield _gauge(
            "sglang:spec_accept_length",
            "Mean tokens committed per request per step (accepted drafts + bonus).",
            model,
            st.avg_accept_length(),
        )
        accept = HistogramMetricFamily(
            "ddtree:accept_length",
            "Tokens committed per request per step.",
            labels=["model_name"],
        )
        stages = HistogramMetricFamily(
            "ddtree:stage_seconds",
            "Time of one decode step's stage (whole batch).",
            labels=["model_name", "stage"],
        )
        steps = CounterMetricFamily(
            "ddtree:steps", "Decode steps by batch size.", labels=["model_name", "batch_size"]
        )
        with st.lock:
            tokens, prompt, reqs = st.tokens_total, st.prefill_tokens_total, st.requests_total
            max_batch = st.max_batch_seen
            for b, n in sorted(st.steps_by_batch.items()):
                steps.add_metric([model, str(b)], float(n))
            _add(accept, [model], st.accept_hist)
            for s in STAGES:
                _add(stages, [model, s], st.stage_hist[s])
        yield _counter("sglang:generation_tokens", "Generated tokens.", model, tokens)
        yield _counter("sglang:prompt_tokens", "Prompt tokens prefilled.", model, prompt)
        yield _counter("ddtree:requests", "Requests admitted.", model, reqs)
        yield _gauge(
            "ddtree:max_batch_size_seen", "Largest batch a step has run.", model, max_batch
        )
        yield steps
        yield accept
        yield stages


def render(stats: StepStats, model: str, running: int, queued: int) -> str:
    """The text exposition (format 0.0.4) of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(stats, model, running, queued))
    return generate_latest(registry).decode()
