"""The benchmarks: tools outside the installed package (``python -m benchmarks`` from a checkout).

Data path: :mod:`.prompts` (prompt sets) -> :mod:`.suite` (plan: methods x
workloads x repeats) -> :mod:`.driver` (one in-process engine per method,
closed-loop load, step timers) -> :mod:`.report` (Markdown, CSV, PNG).
No engine: :mod:`.replay` (candidate drafting replayed on recorded outputs) and
:mod:`.projection` (a roofline or GPU-measured cost model); :mod:`.gpu` runs the
plugin's GPU code on a GPU without vLLM.
"""
