"""The draft rule's plan written out in plain Python, step by step as the rule defines it
(``core/draft_rule.py``'s module docstring): the oracle the compiled plan
(``vllm_lookahead/core/plan_loop.py``, behind ``plan_step``) is checked against, plan for plan."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_lookahead.core.draft_rule import DraftOptions, DraftPlan
from vllm_lookahead.core.step_cost import StepCost


def plan_step_reference(
    options: Sequence[DraftOptions | None], cost: StepCost, base_tokens: int | None = None
) -> list[DraftPlan]:
    """``plan_step``'s plans, worked out in Python."""
    n = len(options)
    tokens = float(n if base_tokens is None else base_tokens)
    step = _Step(tokens, 0.0, max(tokens, float(n)), cost.forward(max(tokens, 1.0)))
    cols = [
        int(o is not None and bool(o.window_column_rows) and o.window_column_rows[0] == 0 and o.window_column_gain > 0)
        for o in options
    ]
    lead = _plan_leads(options, cost, step)
    cands = _plan_branches(options, cost, step, lead, cols)
    return [DraftPlan(lead[r], cands[r], cols[r]) for r in range(n)]


@dataclass
class _Step:
    """The forward planned so far: tokens, tree rows, expected tokens emitted, seconds."""

    tokens: float
    tree_rows: float
    expected: float
    time: float  # the forward of tokens and tree rows, plus fixed
    fixed: float = 0.0  # the drafting requests' fixed prices (DraftOptions.fixed_seconds)


def _plan_leads(options: Sequence[DraftOptions | None], cost: StepCost, step: _Step) -> list[int]:
    """Phase 1: lead tokens, most likely first (the gains fall with i: each request's tokens come
    in order), while a token adds more expected tokens than the time it adds costs."""
    lead = [0] * len(options)
    heap = [
        (-o.lead_gains[0], r, 1) for r, o in enumerate(options) if o is not None and o.lead > 0 and o.lead_gains[0] > 0
    ]
    heapq.heapify(heap)
    while heap:
        neg_gain, r, i = heapq.heappop(heap)
        gain = -neg_gain
        o = options[r]
        assert o is not None
        dt = cost.forward(step.tokens + 1, step.tree_rows) + step.fixed - step.time + gain * o.token_seconds
        if i == 1 and o.fixed_seconds > 0:
            if not _lead_pays_its_price(o, cost, step):
                continue
            dt += o.fixed_seconds
            step.fixed += o.fixed_seconds
        elif gain * step.time <= step.expected * dt:
            continue  # this request's longer lead gains even less
        step.fixed += gain * o.token_seconds
        lead[r] = i
        step.tokens += 1
        step.expected += gain
        step.time += dt
        if i < o.lead:
            heapq.heappush(heap, (-o.lead_gains[i], r, i + 1))
    _drop_leads_that_lower_the_rate(options, cost, step, lead)
    return lead


def _drop_leads_that_lower_the_rate(
    options: Sequence[DraftOptions | None], cost: StepCost, step: _Step, lead: list[int]
) -> None:
    """A priced lead is taken when some prefix of it pays its price against the step as planned so
    far -- which may still be paying an earlier lead's price that its later tokens recover; in
    the end that lead can lower the step's E / T.  Such leads are dropped, the one whose removal
    raises E / T most first, until removing none of them would."""
    while True:
        rate, worst, drop = step.expected / step.time, -1, (0.0, 0.0, 0.0)
        for r, o in enumerate(options):
            if o is None or not lead[r] or o.fixed_seconds <= 0:
                continue
            gained = sum(o.lead_gains[: lead[r]])
            fixed = step.fixed - o.fixed_seconds - gained * o.token_seconds
            time = cost.forward(step.tokens - lead[r], step.tree_rows) + fixed
            if (step.expected - gained) > rate * time:
                rate, worst, drop = (step.expected - gained) / time, r, (gained, fixed, time)
        if worst < 0:
            return
        step.tokens -= lead[worst]
        step.expected, step.fixed, step.time = step.expected - drop[0], drop[1], drop[2]
        lead[worst] = 0


def _lead_pays_its_price(o: DraftOptions, cost: StepCost, step: _Step) -> bool:
    """Whether some prefix of ``o``'s lead raises the step's E / T with the request's fixed price
    paid (O(lead) forward-cost lookups, once per request)."""
    bare = cost.forward(step.tokens, step.tree_rows)
    gained = 0.0
    for k, gain in enumerate(o.lead_gains, start=1):
        gained += gain
        added = cost.forward(step.tokens + k, step.tree_rows) - bare + o.fixed_seconds + gained * o.token_seconds
        if gained * step.time > step.expected * added:
            return True
    return False


def _pieces(o: DraftOptions, lead: int, first_column: int) -> list:
    """One request's further pieces (candidates, then window columns from ``first_column``), each
    ``(gain per row, gain, rows, is a chain, is a candidate)``, merged best first within each kind's order."""
    candidates, columns = [], []
    if lead > 0 and o.candidate_gain > 0:  # candidates only add to a lead
        for rows in o.candidate_rows:
            if rows <= 0:
                break
            candidates.append((o.candidate_gain / rows, o.candidate_gain, rows, False, True))
    if o.window_column_gain > 0:
        for k in range(first_column, len(o.window_column_rows)):
            rows = o.window_column_rows[k]
            chain = k == 0 and lead == 0  # column 0 below a bare root is a chain
            columns.append((o.window_column_gain / max(rows, 1), o.window_column_gain, rows, chain, False))
    return _merge_in_order(candidates, columns)


def _plan_branches(
    options: Sequence[DraftOptions | None], cost: StepCost, step: _Step, lead: list[int], cols: list[int]
) -> list[int]:
    """Phase 2: further candidates and window columns (``cols`` updated in place; the candidates
    returned).  A tree's first branching piece pays the step's fixed tree price
    (tree_step_seconds) for every piece after it, so each request takes the best *prefix* of its
    pieces (best expected tokens per row first; candidates and columns each in their order), if
    that prefix raises E / T; requests whose first piece is most efficient go first."""
    cands = [0] * len(options)
    queues = []
    for r, o in enumerate(options):
        mine = _pieces(o, lead[r], cols[r]) if o is not None else []
        if mine:
            queues.append((-mine[0][0], r, mine))
    queues.sort()
    for _, r, mine in queues:
        best, best_at = step.expected / step.time, 0
        e, tok, rows_tree = step.expected, step.tokens, step.tree_rows
        o = options[r]
        assert o is not None
        fixed = step.fixed + (o.fixed_seconds if lead[r] == 0 else 0.0)  # its first draft pays its price
        for k, (_, gain, rows, chain, _) in enumerate(mine, start=1):
            e, tok, rows_tree = e + gain, tok + rows, rows_tree + (0 if chain else rows)
            ratio = e / (cost.forward(tok, rows_tree) + fixed + (e - step.expected) * o.token_seconds)
            if ratio > best:
                best, best_at = ratio, k
        if best_at == 0:
            continue
        step.fixed = fixed
        for _, gain, rows, chain, candidate in mine[:best_at]:
            if candidate:
                cands[r] += 1
            else:
                cols[r] += 1
            step.tokens += rows
            step.tree_rows += 0 if chain else rows
            step.expected += gain
            step.fixed += gain * o.token_seconds
        step.time = cost.forward(step.tokens, step.tree_rows) + step.fixed
    return cands


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
