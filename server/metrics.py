"""``/metrics`` in Prometheus' text format, named as llama-server names its own
(``llamacpp:...`` there, ``polydev:...`` here)."""

from __future__ import annotations

from .worker import ModelWorker

__all__ = ["prometheus_text"]


def prometheus_text(worker: ModelWorker) -> str:
    """The server's counters and gauges now."""
    now = worker.engine.snapshot()
    busy = worker.busy_seconds
    rows = [
        ("prompt_tokens_total", "counter", "Prompt tokens evaluated.", now.prompt_tokens),
        ("tokens_predicted_total", "counter", "Tokens generated.", now.generated_tokens),
        ("tokens_seconds_total", "counter", "Seconds spent evaluating batches.", busy),
        ("predicted_tokens_seconds", "gauge",
         "Generated tokens per second of evaluation, all sequences together.",
         now.generated_tokens / busy if busy else 0.0),
        ("requests_processing", "gauge", "Requests in a slot.", now.processing),
        ("requests_deferred", "gauge", "Requests waiting for a slot.", now.queued),
        ("kv_cache_tokens", "gauge", "KV cache cells in use.", now.kv_cells_used),
        ("kv_cache_usage_ratio", "gauge", "Share of the KV cache's cells in use.",
         now.kv_cells_used / now.kv_cells_size),
        ("n_slots", "gauge", "Sequences served at once.", len(now.slots)),
        ("draft_tokens_total", "counter", "Drafted tokens checked (speculative decoding).",
         now.drafted_tokens),
        ("draft_tokens_accepted_total", "counter", "Drafted tokens the sampler kept.",
         now.accepted_tokens),
        ("draft_acceptance_ratio", "gauge", "Share of the drafted tokens kept.",
         now.accepted_tokens / now.drafted_tokens if now.drafted_tokens else 0.0),
    ]
    lines = []
    for name, kind, text, value in rows:
        lines += [f"# HELP polydev:{name} {text}", f"# TYPE polydev:{name} {kind}",
                  f"polydev:{name} {value:g}" if isinstance(value, float)
                  else f"polydev:{name} {value}"]
    return "\n".join(lines) + "\n"
