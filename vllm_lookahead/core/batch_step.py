"""A step's drafts for the requests whose pools a :class:`~.pool_batch.PoolBatch` holds, under the
draft rule, from the lookups to the trees with no record made per request until its tree is built.

:func:`~.drafting.draft_step` takes one :class:`~.drafting.DraftRequest` per request, made of
its :class:`~.request.StepCandidates` (every continuation its pools found, as tuples), and lays
out each request's options for the rule (:meth:`~.request.RequestLookahead.lay_out_options`).  At
a few dozen proposing requests those records are most of a proposal's host work, and most of
them are never used: a full batch drafts chains, and chains read the lead alone.
:func:`draft_batch` makes the same drafts in four compiled calls over the step's rows -- the
lookups (:meth:`~.pool_batch.PoolBatch.lookups`), the leads' lengths
(:func:`~.draft_rule.own_lead_lengths`), their growth (:meth:`~.pool_batch.PoolBatch.grow`) and
the plan (:func:`~.plan_loop.plan_rows`, which lays the options out itself) -- and reads each
request only for its records (the lead's odds' shifts, its candidates' and window's rates) and
to build its tree; further candidates become tuples only for requests the plan gives some.

The drafts are those of :func:`~.drafting.draft_step` over
:meth:`~.pool_batch.PoolBatch.step_candidates` (tests/unit/test_batch_step.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .draft_rule import NO_EVIDENCE, LeadEvidence, own_lead_lengths
from .plan_loop import load as plan_loops
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
    where, found, found_sources, answers = pools.lookups(asks, tokens)
    answered = answers.tolist()
    # an admitted request asks its own pools alone, longest context first: pool p matched width - p tokens
    contexts = [pools.width - first if n else 0 for n, first, _ in answered]
    lengths, odds = own_lead_lengths(
        [ask.state.acceptance.lead for ask in asks],
        contexts,
        [support for _, _, support in answered],
        [ask.room for ask in asks],
        [min_gain] * len(asks),
        [ask.state.config.lead_tokens for ask in asks],
    )
    grown, bufs, lead_sources = pools.grow(where, found, found_sources, lengths)
    plans = _plan(asks, answered, grown, odds, found.shape[2], cost, base_tokens)
    drafts = []
    for r, (ask, (n, _, support), context, (t, d), text, sources, lead_odds, (lead, cands, cols)) in enumerate(
        zip(asks, answered, contexts, grown, bufs, lead_sources, odds, zip(*plans))
    ):
        asked = n > 0 and ask.room > 0
        others: list[tuple[tuple[int, ...], int]] = []
        if cands and d:  # the tuples of the further candidates the plan takes
            limit = n if ask.max_candidates is None else min(n, ask.max_candidates)
            others = list(zip(map(tuple, found[r, 1:limit].tolist()), found_sources[r, 1:limit].tolist()))
        candidates = StepCandidates(
            ask.root,
            tuple(text[t : t + d]),
            sources[:d],
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


def _plan(
    asks: Sequence[StepAsk],
    answered: list[list[int]],
    grown: list[list[int]],
    odds: list[list[float]],
    width: int,
    cost: StepCost,
    base_tokens: int | None,
) -> list[list[int]]:
    """The rule's plan (:meth:`.StepOptions.plan`): every ask's options as
    :meth:`.RequestLookahead.lay_out_options` gives them, one row each, planned in one compiled
    call; three lists (lead tokens, further candidates, window columns) in the asks' order."""
    ints: list[int] = []
    floats: list[float] = []
    for ask, (n, _, _), (_, d), lead_odds in zip(asks, answered, grown, odds):
        state = ask.state
        acc = state.acceptance
        window = state.window if ask.window else None
        limit = n if ask.max_candidates is None else min(n, ask.max_candidates)
        ints += (
            d,
            limit - 1 if d else 0,  # further candidates: the lead's siblings, N - 1 tokens each
            width,
            window.filled if window is not None else 0,
            window.window_size if window is not None else 0,
        )
        floats += (
            *(lead_odds if d else (0.0, 0.0)),
            acc.candidate.value,
            acc.window_column.value,
            ask.verify_seconds,
            ask.token_seconds,
        )
    R = len(asks)
    xs, ys, terms = cost.terms()
    out = np.zeros((3, R), dtype=np.int64)
    plan_loops().plan_rows(
        np.array(ints, dtype=np.int64).reshape(R, 5),
        np.array(floats, dtype=np.float64).reshape(R, 6),
        np.array([R if base_tokens is None else base_tokens, *terms], dtype=np.float64),
        xs,
        ys,
        out,
    )
    return out.tolist()
