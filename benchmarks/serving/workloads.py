"""The serving benchmark's workloads: the shipped prompt sets as vLLM ``custom`` datasets.

``chat`` (ShareGPT first turns), ``code`` (MT-bench coding questions and standard-library
completions), ``summarization`` (Spec-Bench: a news article of several hundred tokens and an
instruction -- the long-context, copy-friendly workload), ``qa``, ``math_reasoning``,
``mt_bench``.  Each becomes one JSONL file of ``{"prompt": ...}`` lines, in a fixed order, which
every method's server receives identically.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.prompts import category_prompts

WORKLOADS = {
    "chat": "sharegpt",
    "code": "code",
    "summarization": "summarization",
    "qa": "qa",
    "math_reasoning": "math_reasoning",
    "mt_bench": "mt_bench",
}


def write_dataset(workload: str, count: int, out_dir: Path) -> tuple[Path, int]:
    """(the JSONL file of ``count`` prompts of ``workload``, how many it holds)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    prompts = category_prompts(WORKLOADS[workload], count)
    if not prompts:
        raise ValueError(f"workload {workload!r}: no prompts")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{workload}.jsonl"
    path.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts))
    return path, len(prompts)
