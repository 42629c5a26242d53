"""Which requests may be drafted for.

Greedy verification (:func:`vllm_lookahead.core.greedy_verify`) compares draft
tokens with the raw argmax of the target logits.  Anything that changes the
chosen token beyond a plain argmax -- temperature sampling, penalties,
logit_bias, min_p, min_tokens, bad words, allowed token ids, structured output,
watermarking, thinking budgets -- would make that comparison wrong, and
logprobs would need per-token bookkeeping, so such requests decode without
drafts (exactly as vLLM would) and the log says so once per reason.
"""

from __future__ import annotations

from typing import Any

_EPS = 1e-5


def draft_blocker(sp: Any, num_output_tokens: int) -> str | None:
    """Return why a request must not be drafted for, or None if it may."""
    if sp is None:
        return "no sampling parameters (pooling)"
    if sp.temperature >= _EPS:
        return "temperature > 0 (exact lookahead sampling is not implemented yet)"
    if sp.logprobs is not None or getattr(sp, "logprob_token_ids", None):
        return "logprobs"
    if sp.presence_penalty != 0.0 or sp.frequency_penalty != 0.0 or sp.repetition_penalty != 1.0:
        return "presence/frequency/repetition penalties"
    if sp.logit_bias:
        return "logit_bias"
    if sp.min_p > 0.0:
        return "min_p"
    if sp.allowed_token_ids:
        return "allowed_token_ids"
    if sp.bad_words or getattr(sp, "_bad_words_token_ids", None):
        return "bad_words"
    if sp.min_tokens and num_output_tokens < sp.min_tokens:
        return "min_tokens (until reached)"
    if sp.structured_outputs is not None:
        return "structured output"
    if getattr(sp, "watermarking", None):
        return "watermarking"
    if getattr(sp, "thinking_token_budget", None) is not None:
        return "thinking_token_budget"
    return None
