"""Prometheus text exposition of the engine's state (SGLang-compatible names where they exist)."""

from __future__ import annotations

from engine.stats import STAGES, StepStats


def render(stats: StepStats, model: str, running: int, queued: int) -> str:
    lab = f'model_name="{model}"'
    out: list[str] = []

    def sample(name: str, kind: str, help_: str, value: float) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        out.append(f"{name}{{{lab}}} {float(value)!r}")

    sample("sglang:num_running_reqs", "gauge", "Requests in the running batch.", running)
    sample("sglang:num_queue_reqs", "gauge", "Requests waiting to join the batch.", queued)
    sample(
        "sglang:gen_throughput",
        "gauge",
        "Generated tokens per second (last 10 s).",
        stats.throughput(),
    )
    sample(
        "sglang:spec_accept_length",
        "gauge",
        "Mean tokens committed per request per step (accepted drafts + bonus).",
        stats.avg_accept_length(),
    )
    with stats.lock:
        tokens, prompt, reqs = stats.tokens_total, stats.prefill_tokens_total, stats.requests_total
        max_batch = stats.max_batch_seen
        steps = dict(stats.steps_by_batch)
        accept = list(stats.accept_hist.lines("ddtree:accept_length", lab))
        stage_lines = [
            ln
            for s in STAGES
            for ln in stats.stage_hist[s].lines("ddtree:stage_seconds", f'{lab},stage="{s}"')
        ]
    sample("sglang:generation_tokens_total", "counter", "Generated tokens.", tokens)
    sample("sglang:prompt_tokens_total", "counter", "Prompt tokens prefilled.", prompt)
    sample("ddtree:requests_total", "counter", "Requests admitted.", reqs)
    sample("ddtree:max_batch_size_seen", "gauge", "Largest batch a step has run.", max_batch)
    out.append("# HELP ddtree:steps_total Decode steps by batch size.")
    out.append("# TYPE ddtree:steps_total counter")
    out += [f'ddtree:steps_total{{{lab},batch_size="{b}"}} {n}' for b, n in sorted(steps.items())]
    out.append("# HELP ddtree:accept_length Tokens committed per request per step.")
    out.append("# TYPE ddtree:accept_length histogram")
    out += accept
    out.append("# HELP ddtree:stage_seconds Time of one decode step's stage (whole batch).")
    out.append("# TYPE ddtree:stage_seconds histogram")
    out += stage_lines
    return "\n".join(out) + "\n"
