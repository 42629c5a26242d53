"""What a worker keeps for each live request between steps: one :class:`LiveRequest` record.

A request's record holds, by lifetime:

* ``state`` -- its window and pools (:class:`~vllm_lookahead.core.RequestLookahead`), created
  the first time the request may draft and kept until it finishes;
* ``draft`` -- the tree proposed for the next step, whose tokens vLLM carries as the request's
  linear draft list (``_prepare_inputs`` lays the tree out from it; :mod:`vllm_lookahead.engine.step.tree_batch`);
* ``outcome`` -- that tree verified (:class:`~vllm_lookahead.engine.step.verification.StepOutcome`), from
  ``_sample`` until
  the next proposal observes it;
* ``idle`` / ``phase`` -- how many proposals running offered it to the draft rule for nothing
  (under the draft rule, :meth:`LiveRequests.offered`), and how much of each rest it cuts; while
  it rests, the length its text has when it proposes again is in the resting requests' index (a
  rest of ``r`` proposals taken at length ``L`` ends at ``L + r + 1``: a resting request emits
  one token a step);
* ``pool_ngrams`` -- its pools' size when last counted: :attr:`LiveRequests.pool_ngrams`, the
  pool gauge, is their running sum.  A request that learnt is counted again with the others that
  learnt since, every :data:`COUNT_EVERY` steps (:meth:`LiveRequests.learnt`), not on each step.

:class:`LiveRequests` is the one place that changes them over a request's life: a proposal
takes the outcome (and the draft it verified), a new step drops outcomes nobody observed,
preemption voids the draft and outcome and keeps the pools, a finished or aborted request is
forgotten whole.  Each operation costs O(1) per request it touches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from vllm_lookahead.core import RequestLookahead, StepDraft
    from vllm_lookahead.engine.step.verification import StepOutcome


COUNT_EVERY = 16  # steps between two counts of the pools that learnt (the gauge lags by at most this)
_GOLDEN = 0.6180339887498949  # the golden ratio's fraction: its multiples mod 1 spread evenly
YIELD_DECAY = 0.99  # per offer: the engine's draft yield remembers about its last 100 offers
LOW_YIELD = 0.02  # a draft yield below this: hardly any offer drafts (a batch too full for drafts to pay)


def first_rest_shift(draft_yield: float) -> int:
    """An idle request's first rest is ``max_rest >>`` this: a sixteenth of the longest rest while
    at least one offer in ten drafts (batches of up to ~128 in the host-work replay: yields
    0.12-0.84), a fourth where hardly any does (256 and 1,024 short: 0.001 and 0), an eighth
    between.  A proposal that finds nothing worth drafting costs the same whatever the batch, and
    where the batch is too full for drafts to pay, a new request's way up to its longest rest was
    most of the host work (256 short: ~2 new requests a step, each proposing some 7 times)."""
    return 2 if draft_yield < LOW_YIELD else 3 if draft_yield < 0.1 else 4


@dataclass
class LiveRequest:
    """What the worker keeps for one request (see the module docstring)."""

    state: RequestLookahead | None = None
    draft: StepDraft | None = None
    outcome: StepOutcome | None = None
    idle: int = 0  # proposals running that offered it to the draft rule and drafted nothing
    pool_ngrams: int = 0  # n-grams its pools held when last counted (:meth:`LiveRequests.count_pools`)
    phase: float = 0.0  # in [0, 1): the share of half of each rest it cuts (spreads requests that rest alike)


class LiveRequests:
    """The worker's :class:`LiveRequest` records by request id."""

    def __init__(self) -> None:
        self._records: dict[str, LiveRequest] = {}
        self._waking: dict[str, int] = {}  # the resting requests' wake lengths
        self._verified: list[str] = []  # requests given an outcome since the step began
        self.pool_ngrams = 0  # n-grams the live requests' pools hold, as last counted
        self._learnt: set[str] = set()  # requests whose pools learnt since they were last counted
        self._steps = 0  # steps begun (new_step), for COUNT_EVERY
        self._phase = 0.0  # the next record's phase: golden-ratio steps spread any run of records over [0, 1)
        self.draft_yield = 1.0  # decayed share of offers to the draft rule that drafted (YIELD_DECAY)

    def __len__(self) -> int:
        """Requests the worker keeps anything for (finished ones are forgotten)."""
        return len(self._records)

    def _record(self, req_id: str) -> LiveRequest:
        record = self._records.get(req_id)
        if record is None:
            record = self._records[req_id] = LiveRequest(phase=self._phase)
            self._phase = (self._phase + _GOLDEN) % 1.0
        return record

    def state(self, req_id: str) -> RequestLookahead | None:
        record = self._records.get(req_id)
        return record.state if record is not None else None

    def states(self) -> Iterator[RequestLookahead]:
        return (r.state for r in self._records.values() if r.state is not None)

    def draft(self, req_id: str) -> StepDraft | None:
        """The tree proposed for ``req_id``'s next step (None: no tree of ours)."""
        record = self._records.get(req_id)
        return record.draft if record is not None else None

    def add_state(self, req_id: str, state: RequestLookahead) -> RequestLookahead:
        self._record(req_id).state = state
        self.count_pools(req_id)
        return state

    def count_pools(self, req_id: str) -> None:
        """Count the request's pools again (after they learnt): :attr:`pool_ngrams` follows the
        requests whose pools changed, never a sum over every request."""
        record = self._records[req_id]
        held = record.state.text.pool_ngrams if record.state is not None else 0
        self.pool_ngrams += held - record.pool_ngrams
        record.pool_ngrams = held

    def learnt(self, req_ids: Iterable[str]) -> None:
        """The requests' pools learnt: they are counted again at the next count (:meth:`new_step`)."""
        self._learnt.update(req_ids)

    def _count_learnt(self) -> None:
        records = self._records
        for req_id in self._learnt:
            if req_id in records:
                self.count_pools(req_id)
        self._learnt.clear()

    def set_draft(self, req_id: str, draft: StepDraft) -> None:
        self._record(req_id).draft = draft

    def set_outcome(self, req_id: str, outcome: StepOutcome) -> None:
        """Its tree verified: observed at the next proposal (a request with an outcome rests no more)."""
        self._record(req_id).outcome = outcome
        self._waking.pop(req_id, None)
        self._verified.append(req_id)

    def take_outcome(self, req_id: str) -> StepOutcome | None:
        """The request's verified tree, once: the outcome and the draft it verified are cleared
        (a draft not verified is void once the request has moved on)."""
        record = self._records.get(req_id)
        if record is None:
            return None
        outcome, record.outcome, record.draft = record.outcome, None, None
        return outcome

    def proposing(self, req_ids: list[str], sampled: list[list[int]], lengths: np.ndarray) -> list[int]:
        """The indices of ``req_ids`` that propose this step: all but the resting ones, those whose
        text (``lengths[i]`` tokens, this step's new ones included) is still short of their wake
        length -- a rest runs out as the text grows, one token a step, with no work of its own
        while it lasts (one lookup per request in the resting ones' index: a step at 1,024 in flight
        rests most of them).  A resting request without new tokens
        (``sampled[i]`` empty: not scheduled, or a prompt's chunk) would have nothing to observe
        either; its rest is not spent (its text did not grow)."""
        n, waking = len(req_ids), self._waking
        if not waking:
            return list(range(n))
        out = []
        for i, (req_id, length) in enumerate(zip(req_ids, lengths[:n].tolist())):
            wake = waking.get(req_id)
            if wake is None:
                out.append(i)
            elif length >= wake:  # its rest is over: out of the index
                del waking[req_id]
                out.append(i)
        return out

    def observing(self, req_ids: list[str]) -> list[int]:
        """The indices of ``req_ids`` with an outcome to observe (a step in which none may draft:
        the others have nothing to do)."""
        records = self._records
        waiting = {r for r in self._verified if (record := records.get(r)) is not None and record.outcome is not None}
        return [i for i, req_id in enumerate(req_ids) if req_id in waiting] if waiting else []

    def offered(self, req_id: str, drafted: bool, max_rest: int, length: int) -> None:
        """The request (its text ``length`` tokens) was offered to the draft rule and ``drafted`` or not: after two
        proposals running that drafted nothing it rests 1, then 2, 4 ... up to ``max_rest`` proposals (0: no rest), and
        a draft ends its idleness.  Where ``max_rest`` is long (proposing for every request would cost a large share of
        the forward: hundreds of requests in flight) the first rest is already ``max_rest / 16`` -- ``/ 8`` or ``/ 4``
        where the engine's offers have hardly drafted lately (:attr:`draft_yield`, :func:`first_rest_shift`) -- so that
        each new request's way up to it costs a few proposals, not eight.  Each rest is cut by a share of up to half
        that differs between requests (their phase), so that requests that went idle together (a burst admitted at once,
        a batch where nothing pays) do not all propose again on the same step."""
        self.draft_yield = YIELD_DECAY * self.draft_yield + (1.0 - YIELD_DECAY) * drafted
        record = self._record(req_id)
        record.idle = 0 if drafted else record.idle + 1
        self._rest(req_id, record, max_rest, length)

    def arrive(self, req_id: str, max_rest: int, length: int) -> None:
        """A request scheduled for the first time.  Where the engine's offers hardly draft lately
        (:attr:`draft_yield` below :data:`LOW_YIELD`: a batch too full for drafts to pay) it starts
        as an idle request at its first rest, cut by its phase, rather than proposing for nothing on
        its first two decode steps: a burst of arrivals (a wave of requests replacing a wave that
        finished) then proposes spread over that rest, not all on the steps after its prefill.
        Elsewhere it proposes from its first decode step.  ``max_rest``: the longest rest at the
        last proposal's batch size (:meth:`offered`); ``length``: its prompt's."""
        if max_rest > 0 and self.draft_yield < LOW_YIELD and req_id not in self._records:
            record = self._record(req_id)
            record.idle = 2
            self._rest(req_id, record, max_rest, length)

    def _rest(self, req_id: str, record: LiveRequest, max_rest: int, length: int) -> None:
        """The record's rest after an offer at text ``length``, from its idleness (:meth:`offered`):
        its wake length, the next ``rest`` lengths skipped."""
        first = max(1, max_rest >> first_rest_shift(self.draft_yield))
        rest = min(max_rest, first << (record.idle - 2)) if record.idle >= 2 else 0
        rest -= int(record.phase * rest / 2)  # cut by up to half: the request's phase
        if rest > 0:
            self._waking[req_id] = length + rest + 1
        else:
            self._waking.pop(req_id, None)

    def new_step(self) -> None:
        """A step begins: outcomes of the last one that no proposal observed are dropped; every
        :data:`COUNT_EVERY` steps the pools that learnt meanwhile are counted."""
        self._steps += 1
        if self._steps % COUNT_EVERY == 0:
            self._count_learnt()
        for req_id in self._verified:
            record = self._records.get(req_id)
            if record is not None:
                record.outcome = None
        self._verified.clear()

    def preempted(self, req_id: str) -> RequestLookahead | None:
        """The request recomputes its KV: its draft and outcome are void; its state (to reset) is
        returned."""
        record = self._records.get(req_id)
        if record is None:
            return None
        record.draft = record.outcome = None
        return record.state

    def forget(self, req_ids: Iterable[str]) -> None:
        """Finished or aborted requests: everything kept for them goes."""
        for req_id in req_ids:
            record = self._records.pop(req_id, None)
            if record is not None:
                self.pool_ngrams -= record.pool_ngrams
                self._waking.pop(req_id, None)
