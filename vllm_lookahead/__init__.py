"""vllm-lookahead: Lookahead Decoding (Fu et al., 2024, arXiv:2402.02057) as a vLLM plugin.

Layout, along the data path of one decode step:

* :mod:`vllm_lookahead.config`   -- the user's parameters (W, N, G, ...), validated.
* :mod:`vllm_lookahead.core`     -- pure algorithm, no vLLM: Jacobi window, n-gram pool,
  draft tree (tokens, parents, depths, mask), greedy verification, per-request state.
* :mod:`vllm_lookahead.engine`   -- the only package importing vLLM: config hook,
  runner patches (positions, logits rows, verify, KV compaction), tree attention.
* :mod:`vllm_lookahead.models`   -- the bundled default model (SmolLM2-135M-Instruct).
* :mod:`vllm_lookahead.cli`      -- the ``vllm-lookahead`` command.
"""

__version__ = "0.1.0"
