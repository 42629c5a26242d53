"""One cost-aware draft rule: how much of each request's tree a step should carry.

Every decode step, for the whole batch at once, the rule chooses per request the
lead candidate's length, how many further pool candidates, and how many columns
of the Jacobi window to run, to maximise the expected tokens per second of that
step:

    maximise  E / T,   E = sum_r (1 + expected accepted tokens of r's draft)
                       T = StepCost.forward(tokens in the forward, rows in branching trees)

(the forward-cost model :class:`~.step_cost.StepCost` is the hardware's; the
expected acceptance is each request's own, :class:`Acceptance`).  It starts from
no drafts (``E`` = one token per request, ``T`` = a forward of the bare batch)
and adds draft pieces best-first while each raises ``E / T``, i.e. while a
piece's expected tokens ``g`` and extra time ``dT`` satisfy ``g * T > E * dT``:

1. lead tokens, all requests' together, most likely first: the i-th lead token is
   accepted with probability ``p * q^(i-1)`` (a chain is accepted up to its first
   miss); ``p`` is the request's measured acceptance of the lead's first token and
   ``q`` that of a next token once the previous one was accepted (n-gram drafts are
   bursty: right once, they tend to stay right), both kept apart for a lead at its
   base length and a grown one (a lead grows only after full acceptance, when the
   text repeats: far likelier to be accepted);
2. further candidates and window columns, best gain per row first: a candidate
   adds what the request's extra candidates have added beyond the lead (per
   candidate), a window column what window-only n-grams have been accepted per
   column-step (they are accepted on later steps; Fu et al. 2024 Sec. 3.1:
   each column yields one n-gram per step).  The first such piece also turns the
   request's chain into a branching tree, whose rows pay the tree pass.

So the same rule drafts long trees where forwards are nearly free (a GPU at small
batch), one chain where every token costs (this CPU), less as the batch fills,
and nothing when even the likeliest token does not pay (a batch too full to draft).
Work is O(draft pieces log draft pieces): bounded by the draft size.
Expected acceptance starts from priors (:data:`PRIORS`, from the 2026-11-24
ablation in ``docs/results.md``) and follows each request's own outcomes with
exponential forgetting.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

from .step_cost import StepCost

# Prior beliefs, each worth PRIOR_WEIGHT observations.  Lead: half of the tokens tried are
# accepted.  Extra candidates / window columns: tokens they add per candidate-step /
# column-step, from the 512-token ablation (W0 G7 tree vs lead chain: +0.06-0.41 tokens per
# step from 6 extra candidates; lead + 7-column window vs lead chain: +0.15-0.75 per step).
PRIORS = {"lead_first": 0.4, "lead_next": 0.7, "candidate": 0.04, "window_column": 0.05}
PRIOR_WEIGHT = 2.0
DECAY = 0.9  # weight of the past per observed step


@dataclass
class _Rate:
    """A decayed ratio ``hits / tries`` starting from a prior."""

    prior: float
    cap: float = float("inf")  # the rate never reads above this
    hits: float = 0.0
    tries: float = 0.0

    def __post_init__(self) -> None:
        self.hits, self.tries = self.prior * PRIOR_WEIGHT, PRIOR_WEIGHT

    @property
    def value(self) -> float:
        return min(self.cap, self.hits / self.tries) if self.tries > 0 else self.cap

    def add(self, hits: float, tries: float) -> None:
        """One step's outcome.  Hits without tries (window n-grams accepted while the window is
        not running) raise the rate, so a window whose n-grams keep paying off is run again."""
        if tries > 0 or hits > 0:
            self.hits = DECAY * self.hits + hits
            self.tries = DECAY * self.tries + tries


@dataclass
class Acceptance:
    """One request's acceptance history, as the rule needs it."""

    first_base: _Rate = field(default_factory=lambda: _Rate(PRIORS["lead_first"]))
    next_base: _Rate = field(default_factory=lambda: _Rate(PRIORS["lead_next"]))
    first_grown: _Rate = field(default_factory=lambda: _Rate(PRIORS["lead_first"]))
    next_grown: _Rate = field(default_factory=lambda: _Rate(PRIORS["lead_next"]))
    candidate: _Rate = field(default_factory=lambda: _Rate(PRIORS["candidate"]))
    window_column: _Rate = field(default_factory=lambda: _Rate(PRIORS["window_column"], cap=1.0))

    def lead_rates(self, grown: bool) -> tuple[float, float]:
        """(first token, next token given the previous) acceptance of a lead, base or grown."""
        if grown:
            return self.first_grown.value, self.next_grown.value
        return self.first_base.value, self.next_base.value

    def observe(self, *, lead: int, grown: bool, lead_accepted: int, candidates: int, accepted: int,
                window_columns: int, window_accepted: int) -> None:
        """One verified step: a lead of ``lead`` tokens (``grown``: past its base length), of which
        ``lead_accepted`` accepted; ``candidates`` further candidates; ``accepted`` draft tokens in
        all; ``window_columns`` columns run; ``window_accepted`` accepted tokens that came from
        window-only n-grams (drafted from the window's earlier steps)."""
        if lead > 0:
            first, nxt = (self.first_grown, self.next_grown) if grown else (self.first_base, self.next_base)
            first.add(min(lead_accepted, 1), 1)
            if lead_accepted > 0 and lead > 1:  # tokens 2.. tried: up to the first miss
                nxt.add(lead_accepted - 1, min(lead - 1, lead_accepted))
        if candidates > 0:
            self.candidate.add(max(0, accepted - lead_accepted), candidates)
        self.window_column.add(window_accepted, window_columns)


@dataclass(frozen=True)
class DraftOptions:
    """What one request could draft this step (known before the tree is built)."""

    lead: int                   # tokens the lead candidate has (0: the pools have nothing)
    lead_first: float           # acceptance of the lead's first token
    lead_next: float            # acceptance of each next lead token once the previous one was accepted
    candidate_rows: tuple[int, ...] = ()   # draft nodes each further candidate would add, in order
    candidate_gain: float = 0.0            # expected accepted tokens per further candidate
    window_column_rows: tuple[int, ...] = ()  # draft nodes of window column 0, 1, ...
    window_column_gain: float = 0.0        # expected (later) accepted tokens per column-step


@dataclass(frozen=True)
class DraftPlan:
    lead: int = 0
    candidates: int = 0      # further candidates after the lead
    window_columns: int = 0

    @property
    def empty(self) -> bool:
        return self.lead == 0 and self.candidates == 0 and self.window_columns == 0


def plan_step(options: Sequence[DraftOptions | None], cost: StepCost, base_tokens: int | None = None) -> list[DraftPlan]:
    """Each request's plan for the next forward (``None`` options: a request that cannot draft).

    ``base_tokens``: tokens the forward carries without drafts (default: one per request).
    """
    n = len(options)
    tokens = float(n if base_tokens is None else base_tokens)
    tree_rows = 0.0
    expected = float(n)
    time = cost.forward(max(tokens, 1.0))
    lead = [0] * n
    cands = [0] * n
    # A window still at its first level: column 0 is the root itself (no rows), free to run.
    cols = [int(o is not None and bool(o.window_column_rows) and o.window_column_rows[0] == 0
                and o.window_column_gain > 0) for o in options]

    # 1. Lead tokens, most likely first (p q^(i-1) falls with i: each request's tokens come in order).
    heap = [(-o.lead_first, r, 1) for r, o in enumerate(options) if o is not None and o.lead > 0 and o.lead_first > 0]
    heapq.heapify(heap)
    while heap:
        neg_gain, r, i = heapq.heappop(heap)
        gain = -neg_gain
        dt = cost.forward(tokens + 1, tree_rows) - time
        if gain * time <= expected * dt:
            continue  # this request's longer lead gains even less
        lead[r] = i
        tokens += 1
        expected += gain
        time += dt
        o = options[r]
        if i < o.lead:
            heapq.heappush(heap, (-gain * o.lead_next, r, i + 1))

    # 2. Further candidates and window columns.  A tree's first branching piece pays the
    #    step's fixed tree price (tree_step_seconds) for every piece after it, so each request
    #    takes the best *prefix* of its pieces (best expected tokens per row first; candidates
    #    and columns each in their order), if that prefix raises E / T; requests whose first
    #    piece is most efficient go first.
    queues = []
    for r, o in enumerate(options):
        if o is None:
            continue
        candidates, columns = [], []
        if lead[r] > 0 and o.candidate_gain > 0:  # candidates only add to a lead
            for rows in o.candidate_rows:
                if rows <= 0:
                    break
                candidates.append((o.candidate_gain / rows, o.candidate_gain, rows, False, True))
        if o.window_column_gain > 0:
            for k in range(cols[r], len(o.window_column_rows)):
                rows = o.window_column_rows[k]
                chain = k == 0 and lead[r] == 0  # column 0 below a bare root is a chain
                columns.append((o.window_column_gain / max(rows, 1), o.window_column_gain, rows, chain, False))
        mine = _merge_in_order(candidates, columns)
        if mine:
            queues.append((-mine[0][0], r, mine))
    queues.sort()
    for _, r, mine in queues:
        best, best_at = expected / time, 0
        e, tok, rows_tree = expected, tokens, tree_rows
        for k, (_, gain, rows, chain, _) in enumerate(mine, start=1):
            e, tok, rows_tree = e + gain, tok + rows, rows_tree + (0 if chain else rows)
            ratio = e / cost.forward(tok, rows_tree)
            if ratio > best:
                best, best_at = ratio, k
        if best_at == 0:
            continue
        for _, gain, rows, chain, candidate in mine[:best_at]:
            if candidate:
                cands[r] += 1
            else:
                cols[r] += 1
            tokens += rows
            tree_rows += 0 if chain else rows
            expected += gain
        time = cost.forward(tokens, tree_rows)
    return [DraftPlan(lead[r], cands[r], cols[r]) for r in range(n)]


def _merge_in_order(a: list, b: list) -> list:
    """``a`` and ``b`` interleaved best first (by their first field), each kept in its own order."""
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and a[i][0] >= b[j][0]):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out
