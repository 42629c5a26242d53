"""Which requests lookahead drafts for, and how.

Verification reproduces what vLLM's sampler does for a request
(:mod:`vllm_lookahead.engine.step.target_dist`): greedy and random sampling, temperature, top-k/top-p,
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

import enum
from typing import Any

from vllm_lookahead.engine.propose.request_overrides import turned_off

_EPS = 1e-5


class Undrafted(enum.Enum):
    """Why a request's next step carries no draft: the ``reason`` label of
    ``vllm:lookahead_undrafted_requests_total`` (:mod:`vllm_lookahead.engine.metrics.prometheus`).

    The first six are kinds of request lookahead never drafts for (:func:`draft_blocker`, and the
    engine-wide custom logits processors), logged once per reason; the last three are the step's."""

    POOLING = ("pooling", "no sampling parameters (pooling)")
    MIN_P = ("min_p", "min_p (vLLM refuses it with speculative decoding)")
    LOGIT_BIAS = ("logit_bias", "logit_bias (vLLM refuses it with speculative decoding)")
    LOGPROB_TOKEN_IDS = ("logprob_token_ids", "logprob_token_ids (generative scoring)")
    LOGITS_PROCESSORS = ("logits_processors", "custom logits processors (--logits-processors)")
    REQUEST = ("request", '"lookahead": "off" in their extra_args (the client asked for none)')
    NO_ROOM = ("no_room", "max_tokens, max_model_len or a thinking budget leave no room")
    BATCH_FULL = ("batch_full", "the draft rule or the cap gave the batch no drafts")
    NO_CANDIDATE = ("no_candidate", "nothing worth drafting")

    def __init__(self, label: str, description: str) -> None:
        self.label = label
        self.description = description

    @property
    def client_choice(self) -> bool:
        """Whether the client chose it (logged at INFO, not as a warning)."""
        return self is Undrafted.REQUEST


UNDRAFTED_REASONS = tuple(reason.label for reason in Undrafted)


def draft_blocker(sp: Any) -> Undrafted | None:
    """Why a request must not be drafted for, or None if it may."""
    if sp is None:
        return Undrafted.POOLING
    if sp.min_p > _EPS:
        return Undrafted.MIN_P
    if sp.logit_bias:
        return Undrafted.LOGIT_BIAS
    if getattr(sp, "logprob_token_ids", None):
        return Undrafted.LOGPROB_TOKEN_IDS
    if turned_off(sp):
        return Undrafted.REQUEST
    return None


def is_greedy(sp: Any) -> bool:
    return sp.temperature < _EPS


def chain_only(sp: Any) -> bool:
    """Whether this request may only draft one chain (structured output)."""
    return sp.structured_outputs is not None
