"""vllm-lookahead: Lookahead Decoding (Fu et al., 2024, arXiv:2402.02057) as a vLLM plugin.

Layout, along the data path of one decode step:

* :mod:`vllm_lookahead.config`   -- the user's parameters (W, N, G, ...), validated.
* :mod:`vllm_lookahead.core`     -- pure algorithm, no vLLM: Jacobi window, n-gram pool,
  draft tree (tokens, parents, depths, mask), greedy verification, per-request state.
* :mod:`vllm_lookahead.engine`   -- the only package that changes vLLM: the patch table
  (every replaced vLLM symbol, with its reason), start-up checks, the one owner of
  per-step state (tree layout, tree attention, verification, KV compaction, proposal).
* :mod:`benchmarks`    -- the benchmark; drives vLLM as a user does (and times
  runner methods through the engine's patch mechanism).
* :mod:`vllm_lookahead.models`   -- the bundled default model (SmolLM2-135M-Instruct).
* :mod:`vllm_lookahead.cli`      -- the ``vllm-lookahead`` command (``serve`` runs vLLM's own
  CLI through :mod:`vllm_lookahead.engine.hooks.vllm_cli`).
"""

__version__ = "0.1.0"
