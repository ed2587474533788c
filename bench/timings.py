"""Summaries of measured durations, shared by the server benchmarks (bench_serve_fleet.py and
bench_serve_scale.py): a nearest-rank percentile, and n / p50 / p99 / max in milliseconds."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: float) -> float:
    """The value at rank `q` (0–1) of `values`, nearest rank (non-empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(seconds: list[float]) -> dict[str, float]:
    """n, p50, p99 and max of `seconds`, in milliseconds (zeros for none)."""
    if not seconds:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    ms = [v * 1000 for v in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
    }
