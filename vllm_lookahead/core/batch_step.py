"""A step's drafts for the requests whose pools a :class:`~.pool_batch.PoolBatch` holds, under the
draft rule, from the lookups to the trees with no record made per request until its tree is built.

:func:`~.drafting.draft_step` takes one :class:`~.drafting.DraftRequest` per request, made of
its :class:`~.request.StepCandidates` (every continuation its pools found, as tuples), and lays
out each request's options for the rule (:meth:`~.request.RequestLookahead.lay_out_options`).  At
a few dozen proposing requests those records are most of a proposal's host work, and most of
them are never used: a full batch drafts chains, and chains read the lead alone.
:func:`draft_batch` makes the same drafts in one compiled call over the step's rows
(:func:`~.plan_loop.draft_rows`, through :meth:`~.pool_batch.PoolBatch.draft_rows`): the lookups,
the leads' lengths, their growth and the plan, which lays the options out itself, each phase
reading the arrays the one before wrote.  Each request is read once for its numbers (its text's
place, root, room, window, the lead's odds' shifts, its candidates' and window's rates, its
prices) and once more to build its tree; a draft of the lead alone or of nothing (most of a full
batch's) is made straight from the plan's row (:meth:`~.request.RequestLookahead.lead_draft`,
:meth:`~.request.RequestLookahead.no_draft`), and further candidates become tuples only for
requests the plan gives some.

The drafts are those of :func:`~.drafting.draft_step` over
:meth:`~.pool_batch.PoolBatch.step_candidates` (tests/unit/test_batch_step.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .draft_rule import LEAD_FIRST_LOGIT, LEAD_NEXT_LOGIT, NO_EVIDENCE, SUPPORT_SLOPE, LeadEvidence
from .pool_batch import PoolBatch
from .request import RequestLookahead, StepCandidates, StepDraft
from .step_cost import StepCost


class StepAsk(NamedTuple):
    """One request's part of a batch step: what :meth:`.PoolBatch.step_candidates` asks with
    (its state, its text as ``tokens[row, :length]``, its root, room and candidate limit) and what
    :class:`~.drafting.DraftRequest` adds (whether its window may run, trie merging, its prices)."""

    state: RequestLookahead  # its pools in the batch; its config's mode the draft rule
    row: int
    length: int
    root: int
    room: int
    max_candidates: int | None
    window: bool = True
    merge: bool | None = None
    verify_seconds: float = 0.0
    token_seconds: float = 0.0


def draft_batch(
    pools: PoolBatch,
    asks: Sequence[StepAsk],
    tokens: np.ndarray,
    min_gain: float,
    cost: StepCost,
    base_tokens: int | None = None,
) -> list[StepDraft]:
    """Each ask's draft for the next forward, in order: :func:`~.drafting.draft_step` under
    ``cost`` of the requests :meth:`.PoolBatch.step_candidates` answers (``min_gain``: the step's
    :func:`~.draft_rule.lead_floor`; ``base_tokens``: the bare forward's tokens, default one per
    ask)."""
    if not asks:
        return []
    ints, floats, most = _rows(asks)
    xs, ys, terms = cost.terms()
    head = (len(asks) if base_tokens is None else base_tokens, *terms, min_gain, SUPPORT_SLOPE)
    found, found_sources, answers, odds, buf, sources, plans = pools.draft_rows(
        ints, floats, head, _LEAD_TABLES, tokens, xs, ys, most
    )
    drafts = []
    width = pools.width
    for r, (ask, (n, first, support, t, d), text, lead_sources, lead_odds, lead, cands, cols) in enumerate(
        zip(asks, answers.tolist(), buf.tolist(), sources.tolist(), odds.tolist(), *plans.tolist())
    ):
        asked = n > 0 and ask.room > 0
        if not cols and (not cands or not lead):  # the lead alone, or nothing: no candidates record
            k = min(lead, d, ask.room)
            shadow = text[t + k] if k < d else -1
            # an admitted request asks its own pools alone, longest context first: pool p matched width - p tokens
            evidence = LeadEvidence(width - first if n else 0, max(1, support), False) if asked else NO_EVIDENCE
            state = ask.state
            drafts.append(
                state.lead_draft(ask.root, text[t : t + k], lead_sources[:k], shadow, evidence)
                if k > 0
                else state.no_draft(ask.root, shadow, evidence)
            )
            continue
        others: list[tuple[tuple[int, ...], int]] = []
        if cands and d:  # the tuples of the further candidates the plan takes
            limit = n if ask.max_candidates is None else min(n, ask.max_candidates)
            others = list(zip(map(tuple, found[r, 1:limit].tolist()), found_sources[r, 1:limit].tolist()))
        # an admitted request asks its own pools alone, longest context first: pool p matched width - p tokens
        context = pools.width - first if n else 0
        candidates = StepCandidates(
            ask.root,
            tuple(text[t : t + d]),
            lead_sources[:d],
            others,
            lead_evidence=LeadEvidence(context, max(1, support), False) if asked else NO_EVIDENCE,
            lead_odds=tuple(lead_odds) if asked else None,
        )
        drafts.append(
            ask.state.build(
                candidates, lead=lead, candidates=cands, window_columns=cols, merge=ask.merge, budget=ask.room
            )
        )
    return drafts


def _rows(asks: Sequence[StepAsk]) -> tuple[list[int], np.ndarray, int]:
    """Every ask's numbers as :func:`~.plan_loop.draft_rows` reads them: its ints' columns (one flat
    list), its floats' (its records' shifts and rates, read from their table by slot in one
    gather, then its prices), and the longest lead any ask may grow."""
    ints: list[int] = []
    prices: list[float] = []
    slots: list[int] = []
    tables = set()
    most = 1
    for ask in asks:
        state = ask.state
        lead = state.acceptance.lead
        window = state.window if ask.window else None
        span = state.config.lead_tokens
        ints += (
            state.text.batch_at,
            ask.row,
            ask.length,
            ask.root,
            ask.room,
            span,
            -1 if ask.max_candidates is None else ask.max_candidates,
            window.filled if window is not None else 0,
            window.window_size if window is not None else 0,
        )
        prices += (ask.verify_seconds, ask.token_seconds)
        slots.append(lead.slot)
        tables.add(lead.rows)
        most = max(most, min(ask.room, span))
    floats = np.empty((len(asks), 6), dtype=np.float64)
    if len(tables) == 1:  # an engine's requests: one table
        floats[:, :4] = tables.pop().gather(slots)
    else:
        for r, ask in enumerate(asks):
            lead = ask.state.acceptance.lead
            floats[r, :4] = lead.rows.gather([lead.slot])[0]
    floats[:, 4:] = np.array(prices, dtype=np.float64).reshape(-1, 2)
    return ints, floats, most


# the fitted tables of own-text leads, as plan_loop.draft_rows reads them: first's length, first, next
_LEAD_TABLES = np.array([len(LEAD_FIRST_LOGIT), *LEAD_FIRST_LOGIT, *LEAD_NEXT_LOGIT], dtype=np.float64)
