"""vLLM's own counters, read from an ``LLM`` and turned into the figures we report.

Shared by the benchmark (:mod:`benchmarks`) and the engine tests
(``tests/engine/harness.py``).  Prometheus counters are process-global, so a
figure for one run is always the difference of two snapshots.
"""

from __future__ import annotations

import math
from typing import Any


def engine_metrics(llm: Any) -> dict[str, float]:
    """Every numeric metric of ``llm`` (``LLM.get_metrics()``), summed over label sets."""
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        value = getattr(m, "value", None)
        if isinstance(value, (int, float)):
            out[m.name] = out.get(m.name, 0.0) + float(value)
    return out


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters accumulated between two snapshots."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def mean_accepted_tokens(metrics: dict[str, float]) -> float:
    """MAT = generated tokens / target forwards; every forward yields exactly one non-draft token."""
    gen = metrics.get("vllm:generation_tokens", 0.0)
    acc = metrics.get("vllm:spec_decode_num_accepted_tokens", 0.0)
    return gen / (gen - acc) if gen > acc else math.nan
