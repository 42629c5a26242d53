"""What a decode step costs in this worker, measured: the forward-cost model the draft rule
prices trees with (:class:`~vllm_lookahead.core.step_cost.StepCost`, profiled at start-up by
:mod:`.cost_profile` and refined by every decode-only step served) and the gate that times
drafting against not drafting per batch size (:class:`~vllm_lookahead.core.draft_gate.DraftGate`).

Both only under ``max_tokens_per_step: "auto"``.  Under tensor parallelism the cost model is one
for all ranks (:func:`.cost_profile.agree_across_ranks`) and is not refined, and the gate is left
out: every rank must build the same trees, so no decision may rest on one rank's timings.
``"measure_drafting": false`` or ``VLLM_LOOKAHEAD_DRAFT_GATE=0`` leave the gate out.

Host work: a step with drafts costs the host its proposal (pool lookups, candidates, planning,
trees), outside the step's clock; measured per decoding request over the steps that proposed, it
is what :meth:`host_seconds` hands the draft rule as the fixed price of drafting at all
(``"price_host_work"``, opt-in).  Verification: each request's tree is verified on the host
(its target distributions, the walk; :mod:`.verify_step`) at a cost per request whatever the
tree's size -- a sampled request's ~0.4 ms on the 2-core CPU, a greedy one's ~0.07 ms -- which a
price per row would miss: a one-token draft then costs as much to verify as a long one.  So that
time is measured per verified tree (greedy and sampled apart), taken out of the step's clock, and
handed to the draft rule as each drafting request's own fixed price (:meth:`verify_seconds`,
``"price_verification"``, on by default).  A batch whose plan drafted none of the candidates
offered on two proposing steps running, where proposing costs at least ``REST_MIN_SHARE`` of the
bare forward, *rests*:
the next 1, 2, 4 ... up to ``MAX_REST`` steps propose nothing (no lookups; the pools catch up
when the batch proposes again), the rest doubling each time it recurs and back to 1 after a step
that drafted.  Per request (``"rest_idle_requests"``, on by default): where proposing costs at
least that share, a request offered to the rule for nothing on two proposals running skips the
next 1, 2, 4 ... up to ``REQUEST_MAX_REST`` proposals (:meth:`request_rest`; the other requests
propose as usual).  Neither under tensor parallelism, where every rank must plan alike.

Clocks, in the order :class:`~.runner.RunnerLookahead`'s hooks run them: :meth:`step_started`
(``_prepare_inputs``) -> :meth:`tree_rows` -> :meth:`step_sampled` (after sampling and
verification: one observation of the cost model) -> :meth:`allow_drafts` (at the proposal:
the gate sees the whole decode step since the last proposal, scheduling included).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable

import torch

from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core.decayed import DecayedRatio
from vllm_lookahead.core.draft_gate import DraftGate
from vllm_lookahead.core.step_cost import StepCost
from vllm_lookahead.engine.cost_profile import fallback_cost

logger = logging.getLogger("vllm.lookahead")
MAX_REST = 16  # steps: the longest rest from proposing (a rest never outlasts a short completion by much)
HOST_DECAY = 0.95  # weight of the past per proposing step in the host prices (per request decoding, proposed for)
# A rest only where proposing costs at least this share of the batch's bare forward: a rest saves
# the proposal and can miss a draft that would have paid, and where proposing is cheap (batch 1-4
# on the 2-core CPU: 1-1.5 % of the step; docs/archive/results-2026-11.md#table-2210) there is little to save.
REST_MIN_SHARE = 0.02
VERIFY_DECAY = 0.95  # weight of the past per verified tree in the verification price
REQUEST_MAX_REST = 8  # proposals: the longest rest of one idle request ("rest_idle_requests")


class StepTiming:
    """The worker's cost model and draft gate, and the clocks that feed them."""

    def __init__(self, config: LookaheadConfig) -> None:
        self.measuring = config.cost_rule  # the draft rule reads the cost model
        self.cost: StepCost | None = None
        self.frozen = False  # tensor parallel: one model for all ranks, not refined per rank
        gate_on = config.measure_drafting and os.environ.get("VLLM_LOOKAHEAD_DRAFT_GATE", "1") != "0"
        self.gate = DraftGate() if config.cost_rule and gate_on else None
        self._step: tuple[float, int, int] | None = None  # (start, tokens, tree rows) of this step
        self._proposal: tuple[float, bool] | None = None  # the last proposal's time and whether it drafted
        self._decode_step = False  # whether the step since that proposal was decode-only
        self.price_host = config.cost_rule and config.price_host_work
        self._host = DecayedRatio(HOST_DECAY)  # proposal seconds per decoding request of proposing steps
        self._quiet = 0  # proposing steps running whose plan drafted nothing
        self._rest = 0  # steps left in the current rest
        self._next_rest = 1
        self.price_verify = config.cost_rule and config.price_verification
        self._verify = {True: DecayedRatio(VERIFY_DECAY), False: DecayedRatio(VERIFY_DECAY)}  # greedy or not: seconds per tree
        self._verified_now = 0.0  # this step's verification time (kept out of the forward's clock)
        self.rest_requests = config.cost_rule and config.rest_idle_requests
        self._proposal_cost = DecayedRatio(HOST_DECAY)  # proposal seconds per request proposed for

    def model(self) -> StepCost:
        """The forward-cost model (the bundled CPU profile until the engine's own exists)."""
        if self.cost is None:
            self.cost = fallback_cost()
        return self.cost

    def step_started(self, scheduler_output: Any) -> None:
        """``_prepare_inputs``: a decode-only step (the steps the models learn from) starts its clock."""
        self._step = None
        self._verified_now = 0.0
        self._decode_step = self.measuring and decode_only(scheduler_output)
        if self._decode_step:
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
        """This step's trees verified (:class:`~.verify_step.StepOutcome`): the host time each
        took feeds the verification price of its kind (greedy or sampled) and is kept out of
        the step's time the forward-cost model learns from."""
        if not self.price_verify or self.frozen:
            return
        for outcome in outcomes:
            self._verify[outcome.greedy].add(outcome.seconds)
            self._verified_now += outcome.seconds

    def verify_seconds(self, greedy: bool) -> float:
        """What verifying one request's tree costs the host (greedy or sampled; 0 until
        measured, when not priced, and under tensor parallelism, where no rank may decide from
        its own timings)."""
        per_tree = self._verify[greedy].ratio
        if not self.price_verify or self.frozen or per_tree is None:
            return 0.0
        return per_tree

    def allow_drafts(self, now: float, decoding: int, sampled_token_ids: list[list[int]], can_draft: bool) -> bool:
        """Whether the gate lets the next step draft, once it has seen the decode-only step that
        ends with this proposal (the tokens it emitted for ``decoding`` requests); False only
        when ``can_draft`` and the gate says no."""
        if self.gate is None or self.frozen:
            return True
        if self._proposal is not None and self._decode_step:
            since, drafted = self._proposal
            self.gate.observe(decoding, sum(len(s) for s in sampled_token_ids), now - since, drafted)
        self._decode_step = False
        allowed = not can_draft or self.gate.allow(decoding)
        self._proposal = (now, can_draft and allowed)
        return allowed

    def host_seconds(self, decoding: int) -> float:
        """The proposal's work for ``decoding`` requests, measured (0 when not priced or not
        measured yet)."""
        per_request = self._host.ratio
        if not self.price_host or self.frozen or per_request is None:
            return 0.0
        return per_request * decoding

    def resting(self) -> bool:
        """Whether this step proposes nothing (a rest after plans that drafted nothing)."""
        if self._rest > 0:
            self._rest -= 1
            return True
        return False

    def proposed(self, seconds: float, decoding: int, drafted: int, offered: bool = True) -> None:
        """A proposing step took ``seconds`` for ``decoding`` requests and gave ``drafted`` of them
        drafts, the pools having ``offered`` a candidate or not: the proposal's price learns, and
        two plans running that drafted nothing of what was offered start a rest (a step with no
        candidate at all costs only its lookups, and the next step may have one)."""
        if not self.price_host or self.frozen or decoding <= 0:
            return  # under tensor parallelism no rank may decide from its own timings
        self._host.add(seconds, decoding)
        if drafted:
            self._quiet, self._next_rest = 0, 1
            return
        proposal = self._host.ratio * decoding
        if not offered or proposal < REST_MIN_SHARE * self.model().forward(decoding):
            return  # nothing to leave out, or a proposal too cheap for a rest to save much
        self._quiet += 1
        if self._quiet >= 2:
            self._quiet, self._rest = 0, self._next_rest
            self._next_rest = min(2 * self._next_rest, MAX_REST)

    def proposed_for(self, seconds: float, requests: int) -> None:
        """A proposal did the work of ``requests`` requests (observed, looked up, planned) in
        ``seconds``: what proposing costs per request, which :meth:`request_rest` weighs (not
        measured when requests do not rest)."""
        if not self.rest_requests or self.frozen or requests <= 0:
            return
        self._proposal_cost.add(seconds, requests)

    def request_rest(self, decoding: int) -> int:
        """The longest rest an idle request may take at ``decoding`` requests in flight
        (``"rest_idle_requests"``): :data:`REQUEST_MAX_REST` proposals where proposing for
        every request costs at least ``REST_MIN_SHARE`` of the bare forward -- at 16-32 in flight
        on the 2-core CPU 3-4 % -- else 0, as where proposing is cheap (batch 1: ~1 %) a rest
        saves little and may miss a draft that would have paid.  0 when off, before anything is
        measured, and under tensor parallelism (no rank may decide from its own timings)."""
        per_request = self._proposal_cost.ratio
        if not self.rest_requests or self.frozen or per_request is None or decoding <= 0:
            return 0
        if per_request * decoding < REST_MIN_SHARE * self.model().forward(decoding):
            return 0
        return REQUEST_MAX_REST

    def any_draft_pays(self, decoding: int) -> bool:
        """Whether even a certain draft token would raise the batch's tokens/s (the cost rule's
        test for a batch too full to draft; when it fails no request does any work)."""
        if decoding <= 0:
            return False
        cost = self.model()
        base = cost.forward(decoding)
        return base > decoding * (cost.forward(decoding + 1) - base)

    def log(self) -> None:
        """The periodic log lines of the cost model and the gate (with the stats' own)."""
        if self.cost is None:
            return
        logger.info("lookahead: the draft rule's step cost: %s; verifying a tree %.2f ms greedy, %.2f ms sampled",
                    self.cost.describe(), 1e3 * self.verify_seconds(True), 1e3 * self.verify_seconds(False))
        if self.gate is not None:
            logger.info("lookahead: tokens/s drafting vs not, by requests in flight: %s", self.gate.describe())


def decode_only(scheduler_output: Any) -> bool:
    """Whether every scheduled request decodes (one token plus its drafts): the steps whose
    time the cost model learns from (a prefill chunk's cost is not a decode step's)."""
    spec = scheduler_output.scheduled_spec_decode_tokens or {}
    counts = scheduler_output.num_scheduled_tokens
    return bool(counts) and all(n == 1 + len(spec.get(r, ())) for r, n in counts.items())
