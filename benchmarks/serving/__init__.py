"""The serving benchmark: each method's OpenAI server driven by vLLM's own client, as users measure.

    python -m benchmarks.serving                          # bundled model, every default method
    python -m benchmarks.serving --rounds 3 --workloads chat code summarization --temperatures 0 0.7

Data path: :mod:`.workloads` (prompt sets -> vLLM ``custom`` JSONL datasets) -> :mod:`.plan`
(no speculation's saturation, the load points derived from it, rounds with the method order
reversed) -> :mod:`.server` (a fresh ``vllm-lookahead serve`` per method and round, identical
settings) -> :mod:`.client` (``vllm bench serve``: Poisson or gamma arrivals, or a saturated
queue; TTFT, TPOT, ITL, end-to-end latency, throughput, goodput; every request's text) ->
:mod:`.summary` (ratios against no speculation per round, their spread; outputs compared) ->
:mod:`.report` (Markdown, CSV, latency against request rate per method).
"""
