"""Which requests lookahead drafts for, and how.

Verification reproduces what vLLM's sampler does for a request
(:mod:`.target_dist`): greedy and random sampling, temperature, top-k/top-p,
penalties, bad words, allowed token ids, min_tokens, structured output, seeds,
logprobs.  Requests are served without drafts -- exactly as vLLM serves them
without speculation -- only where that cannot be reproduced per tree node, and
the log says so once per reason:

* ``min_p`` and ``logit_bias``: vLLM itself refuses them with any speculative
  method (its rejection sampler does not apply them to draft rows); lookahead
  accepts such requests and serves them undrafted;
* ``logprob_token_ids`` (generative scoring): vLLM's speculative path does not
  return them either;
* pooling requests (no sampling parameters);
* requests that ask for none: ``"lookahead": "off"`` in their ``extra_args`` (the OpenAI
  server's ``vllm_xargs``; :mod:`.request_overrides`).

Structured-output requests draft one chain (no branching, no window): vLLM's
grammar code computes a bitmask per draft position along a chain.  Requests with a
thinking-token budget are drafted only as deep as vLLM's budget state machine
cannot force a draft row, and never through a thinking marker token
(:mod:`.thinking_budget`).
"""

from __future__ import annotations

from typing import Any

from vllm_lookahead.engine.request_overrides import turned_off

_EPS = 1e-5


def draft_blocker(sp: Any) -> str | None:
    """Why a request must not be drafted for, or None if it may."""
    if sp is None:
        return "no sampling parameters (pooling)"
    if sp.min_p > _EPS:
        return "min_p (vLLM refuses it with speculative decoding)"
    if sp.logit_bias:
        return "logit_bias (vLLM refuses it with speculative decoding)"
    if getattr(sp, "logprob_token_ids", None):
        return "logprob_token_ids (generative scoring)"
    if turned_off(sp):
        return "\"lookahead\": \"off\" in their extra_args"
    return None


# draft_blocker's reasons (and the engine-wide one) as the ``reason`` label of
# ``vllm:lookahead_undrafted_requests`` (:mod:`.prometheus`); the other labels are the runner's:
# ``no_room`` (max_tokens / max_model_len / a thinking budget leave no room), ``batch_full``
# (the draft rule or the cap gave the batch no drafts), ``measured_slower`` (drafting measured
# slower than not drafting at the batch's size: core/draft_gate.py), ``no_candidate`` (nothing
# worth drafting).
_LABELS = {
    "no sampling parameters": "pooling",
    "min_p": "min_p",
    "logit_bias": "logit_bias",
    "logprob_token_ids": "logprob_token_ids",
    "custom logits processors": "logits_processors",
    '"lookahead": "off"': "request",
}


UNDRAFTED_REASONS = (*_LABELS.values(), "no_room", "batch_full", "measured_slower", "no_candidate")


def reason_label(reason: str) -> str:
    """The metric label of a reason :func:`draft_blocker` (or the runner) gave."""
    for prefix, label in _LABELS.items():
        if reason.startswith(prefix):
            return label
    return "other"


def is_greedy(sp: Any) -> bool:
    return sp.temperature < _EPS


def chain_only(sp: Any) -> bool:
    """Whether this request may only draft one chain (structured output)."""
    return sp.structured_outputs is not None
