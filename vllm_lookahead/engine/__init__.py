"""The vLLM glue: the only package that changes vLLM's behaviour (a vLLM upgrade touches only this).

Entry and start-up
    ``plugin.py``     vLLM's ``general_plugins`` entry point: version gate, applies the patch table
    ``version.py``    the supported vLLM range
    ``patches.py``    THE table: every replaced vLLM symbol, with why (mechanism: ``patching.py``)
    ``startup.py``    ``method: lookahead`` -> vLLM's ``custom_class`` hook; refuses engine
                      configs the patches cannot serve (Model Runner V2, FULL CUDA graphs, PP, DCP)

One decode step, in order (state owned by ``runner.RunnerLookahead``, one per worker)
    ``tree_batch.py``   schedule -> tree: the scheduled drafts as trees in vLLM's flat batch
                        (RoPE positions = context + depth, logits rows, draft-row masks)
    ``attention.py``    forward: vLLM's kernel, then branching trees' draft rows with the tree mask
    ``kv.py``           the paged KV cache as the tree path reads it; accepted-path compaction
    ``target_dist.py``  the distribution vLLM's sampler would use at each tree node (penalties,
                        masks, min_tokens on output + path; temperature, top-k/top-p)
    ``verify_step.py``  verify -> compact: roots sampled by vLLM, trees verified (greedy match or
                        exact multi-candidate speculative sampling), KV moved
    ``draft_step.py``, ``eligibility.py``   propose: per-request draft room, window seed, who may draft
    ``thinking_budget.py``  propose: how deep thinking-budget requests may be drafted
    ``proposer.py``     the ``custom_class`` object vLLM calls (a thin adapter)
    ``stats.py``        the plugin's own counters
"""
