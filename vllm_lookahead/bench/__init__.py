"""Side-by-side benchmark harness (``vllm-lookahead bench``).

Data path: :mod:`.prompts` (prompt sets) -> :mod:`.suite` (plan: methods x
workloads x repeats) -> :mod:`.driver` (one in-process engine per method,
closed-loop load, step timers) -> :mod:`.report` (Markdown, CSV, PNG).
"""
