"""One cost-aware draft rule: how much of each request's tree a step should carry.

Every decode step, for the whole batch at once, the rule chooses per request the
lead candidate's length, how many further pool candidates, and how many columns
of the Jacobi window to run, to maximise the expected tokens per second of that
step:

    maximise  E / T,   E = sum_r (1 + expected accepted tokens of r's draft)   (every request decoding)
                       T = StepCost.forward(tokens in the forward, rows in branching trees)

(the forward-cost model :class:`~.step_cost.StepCost` is the hardware's; the
expected acceptance is each request's own, :class:`Acceptance`).  It starts from
no drafts (``E`` = one token per request, ``T`` = a forward of the bare batch)
and adds draft pieces best-first while each raises ``E / T``, i.e. while a
piece's expected tokens ``g`` and extra time ``dT`` satisfy ``g * T > E * dT``:

1. lead tokens, all requests' together, most likely first: the i-th lead token
   adds the probability that it and every lead token before it are accepted (a
   chain is accepted up to its first miss) -- from the lead's own evidence, how
   long a context it was found after and how often its first token followed it,
   calibrated by the request's record (:class:`LeadConfidence`).  The lead is
   built as long as ``max_lead_tokens`` allows (less what :func:`lead_floor`
   shows can never pay) and the rule cuts it where the next token no longer pays;
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
Expected acceptance starts from priors (lead tokens: :class:`LeadConfidence`,
fitted on greedy replays; candidates and window columns: :data:`PRIORS`, from the
2026-11-24 ablation in ``docs/results.md``) and follows each request's own
outcomes with exponential forgetting.  The fitted numbers, each with the recording it
was fitted on and the command that refits it, are in ``core/fitted.json`` (:mod:`.fitted`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .acceptance_rows import (
    CANDIDATE,
    CANDIDATE_RATE,
    FIRST,
    NEXT,
    SHIFT_FIRST,
    SHIFT_NEXT,
    WINDOW,
    WINDOW_RATE,
    AcceptanceRows,
)
from .fitted import FITTED
from .plan_loop import load as plan_loops
from .step_cost import StepCost

# Prior beliefs, each worth PRIOR_WEIGHT observations (lead tokens: LeadConfidence below).  Extra
# candidates / window columns: tokens they add per candidate-step / column-step, from the 512-token
# ablation (fitted.json: draft_rule.PRIORS).
PRIORS: dict[str, float] = dict(FITTED["draft_rule.PRIORS"])
PRIOR_WEIGHT = 2.0
DECAY = 0.9  # weight of the past per observed step


class _Rate:
    """A decayed ratio ``hits / tries`` starting from a prior (``PRIORS[name] * PRIOR_WEIGHT`` hits
    in ``PRIOR_WEIGHT`` tries), read capped (window columns' at 1): one of a request's rates in its
    :class:`~.acceptance_rows.AcceptanceRows` row."""

    __slots__ = ("_rows", "_slot", "_column", "_read")

    def __init__(self, rows: AcceptanceRows, slot: int, column: int, read: int) -> None:
        self._rows, self._slot, self._column, self._read = rows, slot, column, read

    @property
    def value(self) -> float:
        return self._rows.rate(self._slot, self._read)

    @property
    def hits(self) -> float:
        self._rows.fresh()
        return float(self._rows.records[self._slot, self._column])

    @property
    def tries(self) -> float:
        self._rows.fresh()
        return float(self._rows.records[self._slot, self._column + 1])

    def add(self, hits: float, tries: float) -> None:
        """One step's outcome.  Hits without tries (window n-grams accepted while the window is
        not running) raise the rate, so a window whose n-grams keep paying off is run again."""
        self._rows.add_rate(self._slot, self._column, hits, tries)


# How likely a lead's tokens are accepted, from where it was found (Fu et al.'s pool gives no such
# estimate; suffix decoding scores its drafts by frequency, Oliaro et al. 2024):
#   first token   logit p = FIRST[k] + SUPPORT_SLOPE * ln(support)
#   each next one logit q = NEXT[k]    (given the tokens before it were accepted)
# k = the context length the lead's pool matched (1, 2, >= 3 tokens), support = how often its first
# token followed that context (NgramPool.support).  The first-token model was fitted on greedy replays
# of two recordings (fitted.json: draft_rule.LEAD_FIRST_LOGIT, .SUPPORT_SLOPE).  Measured first-token
# acceptance, context 1 / 2 / 3 at support 1: 18 % / 43 % / 75 %; at 5 or more: 70 % / 86 % / 98 %
# (docs/results.md, "Lead confidence").  Next tokens are accepted more the longer the copy has run,
# but a fitted rise with the copy's length over-predicts deep tokens where copying breaks off, and a
# flat, conservative q replayed best (draft_rule.LEAD_NEXT_LOGIT).  Each request then shifts the
# log-odds by its own record (_Calibration).  Log loss of the first-token prediction: 0.503-0.505 on
# both recordings, against 0.59-0.60 for the one decayed rate per request the rule used before.
LEAD_FIRST_LOGIT: tuple[float, ...] = tuple(FITTED["draft_rule.LEAD_FIRST_LOGIT"])
SUPPORT_SLOPE: float = FITTED["draft_rule.SUPPORT_SLOPE"]
LEAD_NEXT_LOGIT: tuple[float, ...] = tuple(FITTED["draft_rule.LEAD_NEXT_LOGIT"])
# A lead found in the shared pool (``shared_pool``: other requests' outputs) is another text's
# continuation, far less likely than the same evidence in the request's own text (teacher-forced:
# first token 12-29 % at support 1 where the own-text model says 18-77 %; next tokens 19-48 % against
# 69-94 %).  Its own tables, fitted to those (fitted.json: draft_rule.SHARED_*):
SHARED_FIRST_LOGIT: tuple[float, ...] = tuple(FITTED["draft_rule.SHARED_FIRST_LOGIT"])
SHARED_SUPPORT_SLOPE: float = FITTED["draft_rule.SHARED_SUPPORT_SLOPE"]
SHARED_NEXT_LOGIT: tuple[float, ...] = tuple(FITTED["draft_rule.SHARED_NEXT_LOGIT"])
# the lead model as the compiled observations read it (acceptance_rows.observe_rows): the four tables'
# lengths, the tables (own first, own next, shared first, shared next), the two support slopes
_LOGIT_TABLES = np.array(
    [
        *map(len, (LEAD_FIRST_LOGIT, LEAD_NEXT_LOGIT, SHARED_FIRST_LOGIT, SHARED_NEXT_LOGIT)),
        *LEAD_FIRST_LOGIT,
        *LEAD_NEXT_LOGIT,
        *SHARED_FIRST_LOGIT,
        *SHARED_NEXT_LOGIT,
        SUPPORT_SLOPE,
        SHARED_SUPPORT_SLOPE,
    ],
    dtype=np.float64,
)


class LeadEvidence(NamedTuple):
    """Where a lead was found: ``context`` tokens matched by its pool's key, ``support`` times its
    first token followed them (:meth:`~.pool.NgramPool.support`), ``shared``: in the shared pool."""

    context: int = 1
    support: int = 1
    shared: bool = False


NO_EVIDENCE = LeadEvidence()  # a step whose pools found no lead


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z > -30 else 0.0


def _by_context(table: tuple[float, ...], context: int) -> float:
    return table[min(max(context, 1), len(table)) - 1]


class _Calibration:
    """How far outcomes sit from predictions, on the log-odds scale: ``logit(observed rate) -
    logit(predicted rate)`` over a decayed record, the observed rate pulled towards the
    predicted one by ``prior_weight`` tries' worth of prior (a request's: :data:`PRIOR_WEIGHT`),
    decayed by ``decay`` per observation (a request's: :data:`DECAY`, like the rule's other rates;
    the pooled record ages per step instead, :meth:`PooledConfidence.age`).  A read-only view of
    ``record[at : at + 3]`` = (tries, hits, expected) of a row of an
    :class:`~.acceptance_rows.AcceptanceRows` (a request's, or a kind's pooled row), its shift in
    ``reads[read]`` (:func:`~.acceptance_rows.observe_rows` applies observations and works it out)."""

    __slots__ = ("_rows", "_record", "_at", "_read")

    def __init__(self, rows: AcceptanceRows, record: str, at: int, read: tuple[str, int, int]) -> None:
        self._rows, self._record, self._at, self._read = rows, (record, read[1]), at, read

    def _field(self, k: int) -> float:
        self._rows.fresh()
        name, row = self._record
        return float(getattr(self._rows, name)[row, self._at + k])

    @property
    def tries(self) -> float:
        return self._field(0)

    @property
    def hits(self) -> float:
        return self._field(1)

    @property
    def expected(self) -> float:
        return self._field(2)

    @property
    def shift(self) -> float:
        self._rows.fresh()
        name, row, column = self._read
        return float(getattr(self._rows, name)[row, column])


# An engine's pooled record (PooledConfidence) ages per step, not per lead, so that it fades back to
# no shift when nothing is drafted (a record that stopped drafts could never be corrected by drafts),
# and needs POOLED_PRIOR_WEIGHT leads' worth of evidence to move far.
POOLED_DECAY = 0.995  # per proposal step: about the last 200 steps
POOLED_PRIOR_WEIGHT = 10.0


def acceptance_rows(kinds: int = 0) -> AcceptanceRows:
    """A table of acceptance records under this rule's priors and lead model, with ``kinds``
    pooled records (an engine's: one for greedy requests, one for sampled ones)."""
    constants = (DECAY, PRIOR_WEIGHT, POOLED_PRIOR_WEIGHT, PRIORS["candidate"], PRIORS["window_column"])
    return AcceptanceRows(kinds, constants, _LOGIT_TABLES)


class PooledConfidence:
    """How the leads an engine drafted for its requests of one kind (greedy, or sampled) were
    accepted against what each request's own estimate expected of them (the lead model shifted
    by the request's record), pooled over requests: a further log-odds shift for every request of
    that kind.  The rule drafts where its estimates are highest, and a request's own record rests
    on a few outcomes, so the leads it drafts are those whose estimates erred upwards (the
    winner's curse); and a sampled request's draft token is accepted with probability ``p(x)``,
    not whenever it is the argmax, which a model fitted on greedy replays does not know.  Measured
    at 16 in flight on code, T=0.7, two rounds, before this record: the drafted leads' tokens
    accepted 423 and 420 times where the rule expected 551 and 588; with it 436 and 318 where 539
    and 356 (docs/bench/2026-11-27-lead-calibration).  Row ``kind`` of ``rows``' pooled records
    (default: a table of its own); the requests of that kind are rows of the same table."""

    def __init__(self, rows: AcceptanceRows | None = None, kind: int = 0) -> None:
        self.rows = rows if rows is not None else acceptance_rows(1)
        self.kind = kind
        self.first = _Calibration(self.rows, "pooled", FIRST, ("pooled_reads", kind, 0))
        self.next = _Calibration(self.rows, "pooled", NEXT, ("pooled_reads", kind, 1))

    def age(self) -> None:
        """One proposal step has passed (:data:`POOLED_DECAY`)."""
        self.rows.age(self.kind, POOLED_DECAY)


class LeadConfidence:
    """Acceptance of a request's lead tokens: the logistic model of the lead's own evidence
    above (the context it was found after, its first token's support), shifted by how far the
    request's outcomes have been from it (:class:`_Calibration`), once for first tokens and
    once for next ones.  A request whose leads keep missing (novel text) is trusted less
    however good the evidence looks; one that keeps hitting weak-looking leads (it repeats
    itself) is trusted more.  Its records are a row of ``pooled``'s table (``pooled``: the
    engine's drafted leads of the same kind, a further shift; None: none, a table of its own)."""

    def __init__(self, pooled: PooledConfidence | None = None) -> None:
        self.pooled = pooled
        self.rows = rows = pooled.rows if pooled is not None else acceptance_rows()
        self.slot = slot = rows.add(pooled.kind if pooled is not None else -1, self)
        self.first_record = _Calibration(rows, "records", FIRST, ("reads", slot, SHIFT_FIRST))
        self.next_record = _Calibration(rows, "records", NEXT, ("reads", slot, SHIFT_NEXT))

    # the fitted model's log-odds of a piece of evidence (a few hundred distinct ones; asked for
    # every lead offered)
    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def _first_logit(e: LeadEvidence) -> float:
        first, slope = (SHARED_FIRST_LOGIT, SHARED_SUPPORT_SLOPE) if e.shared else (LEAD_FIRST_LOGIT, SUPPORT_SLOPE)
        return _by_context(first, e.context) + slope * math.log(max(e.support, 1))

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def _next_logit(e: LeadEvidence) -> float:
        return _by_context(SHARED_NEXT_LOGIT if e.shared else LEAD_NEXT_LOGIT, e.context)

    def first(self, e: LeadEvidence) -> float:
        """Probability that the lead's first token is accepted."""
        return self.odds(e)[0]

    def next(self, e: LeadEvidence) -> float:
        """Probability that a next lead token is accepted once the tokens before it were."""
        return self.odds(e)[1]

    def odds(self, e: LeadEvidence) -> tuple[float, float]:
        """``(first(e), next(e))``: what :meth:`gains` and :meth:`tokens_above` are made of, worked
        out once where a step asks both (the records do not change between the two); asked for
        every lead a step offers, so the two are worked out side by side."""
        first, next_shift = self.shifts()
        return _sigmoid(self._first_logit(e) + first), _sigmoid(self._next_logit(e) + next_shift)

    def shifts(self) -> tuple[float, float]:
        """The log-odds shifts of first and next tokens: the request's record's plus the pooled one's."""
        return self.rows.shifts(self.slot)

    def gains(self, e: LeadEvidence, length: int, odds: tuple[float, float] | None = None) -> tuple[float, ...]:
        """``P(the first i lead tokens are all accepted)`` for i = 1..``length``: what each lead
        token adds to the expected accepted tokens (a chain is accepted up to its first miss).
        ``odds``: :meth:`odds` of ``e``, if already worked out."""
        g, q = odds if odds is not None else self.odds(e)
        out = []
        for _ in range(length):
            out.append(g)
            g *= q
        return tuple(out)

    def tokens_above(self, e: LeadEvidence, floor: float, length: int, odds: tuple[float, float] | None = None) -> int:
        """How many of :meth:`gains` (of ``length`` tokens) are at least ``floor``, without listing them."""
        p, q = odds if odds is not None else self.odds(e)
        if p < floor or p <= 0:
            return 0
        if floor <= 0 or q >= 1:
            return length
        if q <= 0:
            return 1
        return min(length, 1 + int(math.log(floor / p) / math.log(q) + 1e-9))

    def observe(self, e: LeadEvidence, tried: int, accepted: int, drafted: bool = True) -> None:
        """``tried`` lead tokens drafted (or checked), the first ``accepted`` of them accepted;
        ``drafted``: the lead was drafted (not only its first token checked against the emitted
        one), so the pooled record takes it too, against the request's own estimate of it
        (:func:`~.acceptance_rows.observe_rows`: the records' arithmetic)."""
        self.rows.observe(self.slot, tried, accepted, 0, 0, 0, 0, e.context, e.support, e.shared, drafted)


class Acceptance:
    """One request's acceptance history, as the rule needs it: its lead's records
    (:class:`LeadConfidence`) and its further candidates' and window columns' rates, one row of
    an :class:`~.acceptance_rows.AcceptanceRows`."""

    __slots__ = ("lead", "candidate", "window_column", "_observe")

    def __init__(self, lead: LeadConfidence | None = None) -> None:
        self.lead = lead = lead if lead is not None else LeadConfidence()
        self.candidate = _Rate(lead.rows, lead.slot, CANDIDATE, CANDIDATE_RATE)
        self.window_column = _Rate(lead.rows, lead.slot, WINDOW, WINDOW_RATE)
        self._observe = functools.partial(lead.rows.observe, lead.slot)

    def observe(
        self,
        *,
        lead: int,
        lead_accepted: int,
        candidates: int,
        accepted: int,
        window_columns: int,
        window_accepted: int,
        evidence: LeadEvidence = NO_EVIDENCE,
        lead_drafted: bool = True,
    ) -> None:
        """One verified step: a lead of ``lead`` tokens (found on ``evidence``), of which
        ``lead_accepted`` accepted; ``candidates`` further candidates; ``accepted`` draft tokens in
        all; ``window_columns`` columns run; ``window_accepted`` accepted tokens that came from
        window-only n-grams (drafted from the window's earlier steps); ``lead_drafted``: some of the
        lead was drafted (else only its first token was checked against the emitted one).  The
        lead's records take it as :meth:`LeadConfidence.observe`, a further candidate's rate
        ``max(0, accepted - lead_accepted)`` hits in ``candidates`` tries (where there were some),
        the window's rate ``window_accepted`` in ``window_columns``; applied with the table's
        other pending observations at its next read (:mod:`.acceptance_rows`)."""
        self._observe(
            lead,
            lead_accepted,
            candidates,
            accepted,
            window_columns,
            window_accepted,
            evidence.context,
            evidence.support,
            evidence.shared,
            lead_drafted,
        )


_OWN_TABLES = (np.array(LEAD_FIRST_LOGIT), np.array(LEAD_NEXT_LOGIT))  # the compiled lead_lengths' tables


def own_lead_lengths(
    confidences: Sequence[LeadConfidence],
    context: Sequence[int],
    support: Sequence[int],
    rooms: Sequence[int],
    floors: Sequence[float],
    spans: Sequence[int],
) -> tuple[list[int], list[list[float]]]:
    """The leads a batch of requests found in their own pools (not the shared one), ``context[r]``
    tokens matched (0: none found) with ``support[r]``, under the rule: per request the lead
    length :meth:`.RequestLookahead.lead_request` asks for (``spans[r]``: its config's
    ``lead_tokens``, ``floors[r]``: its ``min_gain``) and ``confidences[r].odds`` of the lead, in
    one compiled call (:func:`.plan_loop.lead_lengths`)."""
    R = len(confidences)
    lengths = np.zeros(R, dtype=np.int64)
    odds = np.zeros((R, 2), dtype=np.float64)
    plan_loops().lead_lengths(  # two arrays in, not six: a compiled call's arguments cost per call
        np.array([context, support, rooms, spans], dtype=np.int64).reshape(4, R),
        np.array([(*c.shifts(), floor) for c, floor in zip(confidences, floors)], dtype=np.float64).reshape(R, 3),
        *_OWN_TABLES,
        SUPPORT_SLOPE,
        lengths,
        odds,
    )
    return lengths.tolist(), odds.tolist()


# not frozen: made per request and step, where a frozen dataclass's init costs 2-3x (design.md, "A step's records")
@dataclass(slots=True)
class DraftOptions:
    """What one request could draft this step (known before the tree is built)."""

    lead_gains: tuple[float, ...] = ()  # per lead token: P(it and every lead token before it are accepted)
    candidate_rows: tuple[int, ...] = ()  # draft nodes each further candidate would add, in order
    candidate_gain: float = 0.0  # expected accepted tokens per further candidate
    window_column_rows: tuple[int, ...] = ()  # draft nodes of window column 0, 1, ...
    window_column_gain: float = 0.0  # expected (later) accepted tokens per column-step
    fixed_seconds: float = 0.0  # what drafting anything costs this request beyond its rows (verifying its tree)
    token_seconds: float = 0.0  # what each accepted draft token costs beyond its rows (sampling the token after it)

    @property
    def lead(self) -> int:
        """Tokens the lead candidate has (0: the pools have nothing)."""
        return len(self.lead_gains)


# not frozen: made per request and step, where a frozen dataclass's init costs 2-3x (design.md, "A step's records")
@dataclass(slots=True)
class DraftPlan:
    lead: int = 0
    candidates: int = 0  # further candidates after the lead
    window_columns: int = 0

    @property
    def empty(self) -> bool:
        return self.lead == 0 and self.candidates == 0 and self.window_columns == 0


def lead_floor(cost: StepCost, base_tokens: int, span: int) -> float:
    """A gain below which no lead token is drafted in a step whose bare forward carries
    ``base_tokens`` tokens, leads of up to ``span`` tokens: a piece is added only while
    ``g * T > E * dT``, and ``E / T`` starts at >= 1 / T(bare) and only grows as pieces are
    added, while ``dT`` is at least the cheapest marginal token of the range.  Lead tokens
    expected to add less need not even be looked up (per-step work bounded by what can be drafted).
    Every marginal token carries the same fitted scale and per-token price, so the cheapest one is
    the profile's cheapest (worked out once per range) priced as a real step: O(1) per step."""
    if base_tokens <= 0 or span <= 0:
        return 0.0
    cheapest = cost.scale * cost.cheapest_token(base_tokens, span) + cost.token_seconds
    return max(0.0, cheapest) / cost.chain_forward(base_tokens)


class StepOptions:
    """A step's draft options laid out flat, as the compiled plan reads them (:mod:`.plan_loop`):
    each request's :class:`DraftOptions` one row of a few lists, appended by :meth:`add` -- or by
    :meth:`add_request` straight from what a request knows (its lead's odds, its window's fill),
    with no record made per request (:func:`~.drafting.draft_step`, every step)."""

    __slots__ = ("gains", "lead_at", "rows", "cand_at", "col_at", "scalars", "present")

    def __init__(self) -> None:
        self.gains: list[float] = []
        self.lead_at = [0]
        self.rows: list[int] = []
        self.cand_at = [0]
        self.col_at: list[int] = []
        self.scalars: list[float] = []  # four per request: plan_loop's CAND_GAIN, COL_GAIN, FIXED, PER_TOKEN
        self.present: list[bool] = []

    def __len__(self) -> int:
        return len(self.present)

    def add(self, o: DraftOptions | None) -> None:
        """One request's options (None: it cannot draft)."""
        if o is None:
            self.col_at.append(len(self.rows))
            self.scalars += (0.0, 0.0, 0.0, 0.0)
        else:
            self.gains += o.lead_gains
            self.rows += o.candidate_rows
            self.col_at.append(len(self.rows))
            self.rows += o.window_column_rows
            self.scalars += (o.candidate_gain, o.window_column_gain, o.fixed_seconds, o.token_seconds)
        self.present.append(o is not None)
        self.lead_at.append(len(self.gains))
        self.cand_at.append(len(self.rows))

    def add_request(
        self,
        lead_odds: tuple[float, float],
        lead: int,
        candidate_rows: Sequence[int],
        candidate_gain: float,
        window_filled: int,
        window_size: int,
        window_column_gain: float,
        fixed_seconds: float,
        token_seconds: float,
    ) -> None:
        """One request's options as :meth:`add` lays out ``DraftOptions(lead_gains=<lead tokens of a
        lead with odds lead_odds>, window_column_rows=<a window of window_size columns filled to
        window_filled levels>, ...)``: a lead token's gain is ``first * next ** i``
        (:meth:`LeadConfidence.gains`), a window's first column has one row less (the root is its
        first level); ``window_size`` 0: no window."""
        g, q = lead_odds
        gains = self.gains
        for _ in range(lead):
            gains.append(g)
            g *= q
        rows = self.rows
        rows += candidate_rows
        self.col_at.append(len(rows))
        if window_size:
            rows.append(window_filled - 1)
            rows += (window_filled,) * (window_size - 1)
        self.scalars += (candidate_gain, window_column_gain, fixed_seconds, token_seconds)
        self.present.append(True)
        self.lead_at.append(len(gains))
        self.cand_at.append(len(rows))

    def options(self, r: int) -> DraftOptions | None:
        """Request ``r``'s options as a record (None: it cannot draft)."""
        if not self.present[r]:
            return None
        col, scalars = self.col_at[r], self.scalars[4 * r : 4 * r + 4]
        return DraftOptions(
            lead_gains=tuple(self.gains[self.lead_at[r] : self.lead_at[r + 1]]),
            candidate_rows=tuple(self.rows[self.cand_at[r] : col]),
            candidate_gain=scalars[0],
            window_column_rows=tuple(self.rows[col : self.cand_at[r + 1]]),
            window_column_gain=scalars[1],
            fixed_seconds=scalars[2],
            token_seconds=scalars[3],
        )

    def plan(self, cost: StepCost, base_tokens: int | None = None) -> tuple[list[int], list[int], list[int]]:
        """Every request's plan (see :func:`plan_step`): its lead tokens, further candidates and
        window columns, three lists in the requests' order."""
        n = len(self.present)
        xs, ys, terms = cost.terms()
        out = np.zeros((3, n), dtype=np.int64)
        rows = self.rows
        plan_loops().plan(  # two arrays in, not eight: a compiled call's arguments cost per step (plan_loop.plan)
            np.array(
                [n, len(self.gains), len(rows), *self.lead_at, *rows, *self.cand_at, *self.col_at, *self.present],
                dtype=np.int64,
            ),
            np.array([n if base_tokens is None else base_tokens, *terms, *self.gains, *self.scalars], dtype=np.float64),
            xs,
            ys,
            out,
        )
        return out.tolist()


def plan_step(
    options: Sequence[DraftOptions | None], cost: StepCost, base_tokens: int | None = None
) -> list[DraftPlan]:
    """Each request's plan for the next forward (``None`` options: a request that cannot draft).

    ``base_tokens``: tokens the forward carries without drafts, one per request decoding, each
    emitting one token whatever is drafted (default: one per request in ``options``).  The batch's
    requests that are not offered here (no room, not eligible, resting) count in it: they emit their
    token too, and a plan that counted only the offered requests would value a draft token above
    what it adds to the batch's tokens per second.
    A request's own fixed price (``DraftOptions.fixed_seconds``: verifying its tree) is paid by
    its first draft token, which is taken only where some prefix of its lead pays that price
    with its rows (or, without a lead, some prefix of its further pieces).  Its price per accepted
    token (``DraftOptions.token_seconds``: a sampled request samples the token after every accepted
    one, as vLLM's sampler samples each token without speculation) is paid by every piece in
    proportion to its expected tokens: ``dT`` grows by ``g * token_seconds``.

    The walk itself is one compiled call over the batch's options laid out flat (:class:`StepOptions`,
    :mod:`.plan_loop`).
    """
    step = StepOptions()
    for o in options:
        step.add(o)
    return [DraftPlan(lead, cands, cols) for lead, cands, cols in zip(*step.plan(cost, base_tokens))]


def compile_plan() -> None:
    """Compile the rule's loops (numba; cached on disk after the first time) -- :func:`plan_step`'s,
    the batch's (:func:`.plan_loop.plan_rows`), the leads' lengths, the acceptance records'
    (:mod:`.acceptance_rows`) -- at start-up, not in the first step that drafts."""
    option = DraftOptions((0.9, 0.5), (2,), 0.1, (0, 3), 0.1, fixed_seconds=1e-4, token_seconds=1e-5)
    cost = StepCost.linear(0.01, 1e-4, tree_row=1e-4)
    plan_step([option, None], cost)
    xs, ys, terms = cost.terms()  # the batch's plan (batch_step.draft_batch)
    out = np.zeros((3, 1), dtype=np.int64)
    rows = np.array([[2, 1, 4, 2, 3]], dtype=np.int64), np.array([[0.9, 0.5, 0.1, 0.1, 1e-4, 1e-5]])
    plan_loops().plan_rows(*rows, np.array([1.0, *terms]), xs, ys, out)
    own_lead_lengths([LeadConfidence()], [1], [1], [4], [0.05], [8])
    pooled = PooledConfidence()  # the acceptance records' loops: an observation applied, a step's ageing
    acc = Acceptance(LeadConfidence(pooled))
    acc.observe(lead=2, lead_accepted=1, candidates=1, accepted=1, window_columns=1, window_accepted=0)
    pooled.age()
    acc.candidate.add(1, 1)
