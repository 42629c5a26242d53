"""What a decode step costs in this worker, measured: the forward-cost model the draft rule
prices trees with (:class:`~vllm_lookahead.core.step_cost.StepCost`, profiled at start-up by
:mod:`vllm_lookahead.engine.propose.cost_profile` and refined by every decode-only step served),
the price of verifying a request's tree, and which idle requests rest from proposing.

All of it only under :attr:`~vllm_lookahead.config.DraftMode.AUTO`.  Under tensor parallelism the
cost model is one for all ranks (:func:`~vllm_lookahead.engine.propose.cost_profile.agree_across_ranks`)
and is not refined, and neither price nor rest applies: every rank must build the same trees, so
no decision may rest on one rank's timings.

Verification: each request's tree is verified on the host (its target distributions, the walk;
:mod:`vllm_lookahead.engine.step.verification`) at a cost per request whatever the tree's size,
which a price per row would miss: a one-token draft then costs as much to verify as a long one.
So that time is measured per verified tree (greedy and sampled apart), taken out of the step's
clock, and handed to the draft rule as each drafting request's own fixed price
(:meth:`StepTiming.verify_seconds`).  A sampled walk's sampling passes are apart from it: each
samples the token after an accepted node, as vLLM's sampler would in a later step without
speculation (~1 ms per token for a 49k vocabulary on one core of the 2-core CPU, most of it the
sampler's noise), so they are a price per accepted token (:meth:`StepTiming.token_seconds`), which
the rule weighs against each piece's expected tokens.

Idle requests: where proposing costs at least ``REST_MIN_SHARE`` of the bare forward, a request
offered to the rule for nothing on two proposals running skips the next 1, 2, 4 ... up to
``REQUEST_MAX_REST`` proposals, or more where proposing costs more (:meth:`StepTiming.request_rest`;
the other requests propose as usual).

Clocks, in the order :class:`~vllm_lookahead.engine.runner.RunnerLookahead`'s hooks run them:
:meth:`StepTiming.step_started` (``_prepare_inputs``) -> :meth:`StepTiming.tree_rows` ->
:meth:`StepTiming.step_sampled` (after sampling and verification: one observation of the cost model).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import Any

import torch

from vllm_lookahead.config import DraftMode, LookaheadConfig
from vllm_lookahead.core.decayed import DecayedRatio
from vllm_lookahead.core.step_cost import StepCost
from vllm_lookahead.engine.propose.cost_profile import fallback_cost

logger = logging.getLogger("vllm.lookahead")
PROPOSAL_DECAY = 0.95  # weight of the past per proposing step in the proposal price (per request proposed for)
# A rest only where proposing costs at least this share of the batch's bare forward: a rest saves
# the proposal and can miss a draft that would have paid, and where proposing is cheap (batch 1-4
# on the 2-core CPU: 1-1.5 % of the step) there is little to save.
REST_MIN_SHARE = 0.02
VERIFY_DECAY = 0.95  # weight of the past per verified tree in the verification price
REQUEST_MAX_REST = 8  # proposals: an idle request's longest rest where proposing is a few % of the forward
REQUEST_REST_LIMIT = 128  # proposals: its longest rest anywhere


class StepTiming:
    """The worker's cost model, verification price and request rests, and the clocks that feed them."""

    def __init__(self, config: LookaheadConfig) -> None:
        self.measuring = config.mode is DraftMode.AUTO  # the draft rule reads the cost model and the prices
        self.cost: StepCost | None = None
        self.frozen = False  # tensor parallel: one model for all ranks, not refined per rank
        self._step: tuple[float, int, int] | None = None  # (start, tokens, tree rows) of this step
        self._verify = {
            True: DecayedRatio(VERIFY_DECAY),
            False: DecayedRatio(VERIFY_DECAY),
        }  # greedy or not: seconds per tree
        self._sampled_token = DecayedRatio(VERIFY_DECAY)  # walk sampling seconds per accepted token
        self._verified_now = 0.0  # this step's verification time (kept out of the forward's clock)
        self._proposal_cost = DecayedRatio(PROPOSAL_DECAY)  # proposal seconds per request proposed for

    def model(self) -> StepCost:
        """The forward-cost model (the bundled CPU profile until the engine's own exists)."""
        if self.cost is None:
            self.cost = fallback_cost()
        return self.cost

    def step_started(self, scheduler_output: Any) -> None:
        """``_prepare_inputs``: a decode-only step (the steps the models learn from) starts its clock."""
        self._step = None
        self._verified_now = 0.0
        if self.measuring and decode_only(scheduler_output):
            self._step = (time.perf_counter(), int(scheduler_output.total_num_scheduled_tokens), 0)

    @property
    def timing_step(self) -> bool:
        """Whether this step's clock runs (then :meth:`tree_rows` wants its tree rows)."""
        return self._step is not None

    def tree_rows(self, rows: int) -> None:
        """The step's rows recomputed with the tree mask (what a tree adds to a chain's forward)."""
        if self._step is not None:
            self._step = (*self._step[:2], rows)

    def step_sampled(self, logits: torch.Tensor) -> None:
        """Feed the cost model the decode-only step that just ran, from ``_prepare_inputs`` through
        sampling and verification, less the trees' own verification (priced per request,
        :meth:`verify_seconds`): what a draft token costs is its rows in the forward, their logits
        and sampling, and the draft rule weighs that."""
        clock, self._step = self._step, None
        verified, self._verified_now = self._verified_now, 0.0
        if clock is None or self.frozen:
            return
        if logits.device.type == "cuda":
            torch.cuda.synchronize(logits.device)
        start, tokens, rows = clock
        # verifying the trees is priced per request (verify_seconds), not per row
        self.model().observe(tokens, rows, time.perf_counter() - start - verified)

    def verified(self, outcomes: Iterable[Any]) -> None:
        """This step's trees verified (:class:`~vllm_lookahead.engine.step.verification.StepOutcome`):
        the host time each took feeds the verification price of its kind (greedy or sampled), the
        time a sampled walk took sampling the tokens after its accepted nodes the price per accepted
        token (:meth:`token_seconds`), and both are kept out of the step's time the forward-cost
        model learns from."""
        if not self.measuring or self.frozen:
            return
        for outcome in outcomes:
            self._verify[outcome.greedy].add(outcome.seconds)
            accepted = len(outcome.path)
            if accepted and not outcome.greedy:
                self._sampled_token.add(outcome.sampling_seconds, accepted)
            self._verified_now += outcome.seconds + outcome.sampling_seconds

    def verify_seconds(self, greedy: bool) -> float:
        """What verifying one request's tree costs the host (greedy or sampled; 0 until
        measured, outside the draft rule, and under tensor parallelism, where no rank may decide
        from its own timings)."""
        per_tree = self._verify[greedy].ratio
        if not self.measuring or self.frozen or per_tree is None:
            return 0.0
        return per_tree

    def token_seconds(self, greedy: bool) -> float:
        """What each accepted draft token of a sampled request costs the host beyond its rows: the
        token after it is sampled from its row (temperature, top-k/top-p, the sampler's noise:
        ~1 ms for a 49k vocabulary on one core of the 2-core CPU), work vLLM's sampler does for that
        token in a later step without speculation -- so it is priced per expected accepted token,
        not per tree.  0 for greedy requests (their match reads argmaxes the forward left), until
        measured, outside the draft rule and under tensor parallelism."""
        per_token = self._sampled_token.ratio
        if greedy or not self.measuring or self.frozen or per_token is None:
            return 0.0
        return per_token

    def proposed_for(self, seconds: float, requests: int) -> None:
        """A proposal did the work of ``requests`` requests (observed, looked up, planned) in
        ``seconds``: what proposing costs per request, which :meth:`request_rest` weighs (not
        measured outside the draft rule)."""
        if not self.measuring or self.frozen or requests <= 0:
            return
        self._proposal_cost.add(seconds, requests)

    def request_rest(self, decoding: int) -> int:
        """The longest rest an idle request may take at ``decoding`` requests in flight: none where
        proposing for every request costs less than ``REST_MIN_SHARE`` of the bare forward (batch
        1 on the 2-core CPU: ~1 %; a rest saves little there and may miss a draft that would have
        paid); else :data:`REQUEST_MAX_REST` proposals, or as many as bring the proposals of
        requests at their longest rest (one in ``rest + 1`` steps) down to about
        ``REST_MIN_SHARE`` of the forward, up to :data:`REQUEST_REST_LIMIT` -- at hundreds of
        requests on a GPU, where proposing for all of them would cost several forwards.  0
        outside the draft rule, before anything is measured, and under tensor parallelism (no rank
        may decide from its own timings)."""
        per_request = self._proposal_cost.ratio
        if not self.measuring or self.frozen or per_request is None or decoding <= 0:
            return 0
        share = per_request * decoding / self.model().forward(decoding)
        if share < REST_MIN_SHARE:
            return 0
        return min(REQUEST_REST_LIMIT, max(REQUEST_MAX_REST, math.ceil(share / REST_MIN_SHARE)))

    def any_draft_pays(self, decoding: int) -> bool:
        """Whether even a certain draft token would raise the batch's tokens/s (the draft rule's
        test for a batch too full to draft; when it fails no request does any work)."""
        if decoding <= 0:
            return False
        cost = self.model()
        base = cost.forward(decoding)
        return base > decoding * (cost.forward(decoding + 1) - base)

    def log(self) -> None:
        """The periodic log line of the cost model (with the stats' own)."""
        if self.cost is None:
            return
        logger.info(
            "lookahead: the draft rule's step cost: %s; verifying a tree %.2f ms greedy, %.2f ms sampled "
            "(+%.2f ms per accepted token, sampling the next)",
            self.cost.describe(),
            1e3 * self.verify_seconds(True),
            1e3 * self.verify_seconds(False),
            1e3 * self.token_seconds(False),
        )


def decode_only(scheduler_output: Any) -> bool:
    """Whether every scheduled request decodes (one token plus its drafts): the steps whose
    time the cost model learns from (a prefill chunk's cost is not a decode step's)."""
    spec = scheduler_output.scheduled_spec_decode_tokens or {}
    counts = scheduler_output.num_scheduled_tokens
    if not counts:
        return False
    # Every scheduled request runs at least its last token and its scheduled drafts, so the step's
    # tokens are that least sum exactly when each request runs no more (no prefill chunk).
    return sum(counts.values()) == len(counts) + sum(map(len, spec.values()))
