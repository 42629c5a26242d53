"""The draft rule's plan for a step (:func:`~.draft_rule.plan_step`) as one compiled loop.

The rule (the module docstring of :mod:`.draft_rule`) walks every drafting request's lead tokens,
further candidates and window columns best-first, asking the forward-cost model a few hundred
times a step at a few dozen drafting requests; in Python that is ~15 us per drafting request.
Here the batch's options come in as flat arrays (laid out by :class:`~.draft_rule.StepOptions`), the
cost model as its profile and fitted terms (:meth:`~.step_cost.StepCost.terms`), and one call
returns every request's plan.  Every sum and comparison is made in the same order as the rule's
definition, so the plans are the same.

Per request ``r``, the options are:

- ``gains[lead_at[r] : lead_at[r + 1]]``: each lead token's expected gain (:attr:`DraftOptions.lead_gains`);
- ``rows[cand_at[r] : col_at[r]]``: each further candidate's rows; ``rows[col_at[r] : cand_at[r + 1]]``:
  each window column's rows (``cand_at`` and ``col_at`` interleave over one ``rows`` array);
- ``scalars[r]``: candidate gain, window-column gain, fixed price, price per accepted token;
- ``present[r]``: 0 for a request without options (it drafts nothing).

:func:`plan_rows` is the same plan for options given one row per request (the batch's, from
its arrays).  :func:`lead_lengths` is the rule's other compiled loop: how long each of a batch's leads is looked
up to (:func:`~.draft_rule.own_lead_lengths`, from :class:`~.pool_batch.PoolBatch`).
:func:`draft_rows` is a batch step's lookups, leads and plan in one call (its pools' loops
compiled into it: :func:`~.batch_step.draft_batch`).

Compiled by :func:`load` on first use (numba is not imported before; see :mod:`.ngram_table`).
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np

from .ngram_table import load as load_pool_loops

CAND_GAIN, COL_GAIN, FIXED, PER_TOKEN = 0, 1, 2, 3  # scalars' columns
# pieces' columns: gain per row, gain, rows, is a chain, is a candidate
GAIN_PER_ROW, GAIN, ROWS, CHAIN, CANDIDATE = 0, 1, 2, 3, 4
# the step planned so far, one float64 array the phases share: its tokens, tree rows, expected
# tokens emitted, seconds (forward plus fixed prices) and the drafting requests' fixed prices
TOKENS, TREE_ROWS, EXPECTED, TIME, FIXED_TOTAL = 0, 1, 2, 3, 4


def _chain(xs, ys, tokens):
    """The profiled chain forward of ``tokens`` tokens (StepCost._interpolated)."""
    n = len(xs)
    if n == 1:
        if tokens > xs[0]:
            return ys[0] * max(tokens, 1.0) / xs[0]
        return ys[0]
    lo, hi = 0, n
    while lo < hi:  # bisect_left
        mid = (lo + hi) // 2
        if xs[mid] < tokens:
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return ys[0]
    i = min(lo, n - 1)  # past the last point: the last segment's slope
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)


def _forward(xs, ys, terms, tokens, tree_rows):
    """StepCost.forward; ``terms``: scale, per-token price, tree step price, tree row price."""
    t = terms[0] * _chain(xs, ys, tokens) + terms[1] * (tokens - 1.0 if tokens > 1.0 else 0.0)
    if tree_rows > 0:
        t += terms[2] + terms[3] * tree_rows
    return t


def _before(hk, hr, hi, a, b) -> bool:
    """Heap entry ``a`` comes before ``b``: (key, request, token) ascending."""
    if hk[a] != hk[b]:
        return hk[a] < hk[b]
    if hr[a] != hr[b]:
        return hr[a] < hr[b]
    return hi[a] < hi[b]


def _swap(hk, hr, hi, a, b) -> None:
    hk[a], hk[b] = hk[b], hk[a]
    hr[a], hr[b] = hr[b], hr[a]
    hi[a], hi[b] = hi[b], hi[a]


def _push(hk, hr, hi, size, key, r, i) -> int:
    hk[size], hr[size], hi[size] = key, r, i
    c = size
    while c > 0:
        p = (c - 1) // 2
        if not _before(hk, hr, hi, c, p):
            break
        _swap(hk, hr, hi, c, p)
        c = p
    return size + 1


def _pop(hk, hr, hi, size) -> int:
    """Move the first entry to ``size - 1``; returns the new size."""
    size -= 1
    _swap(hk, hr, hi, 0, size)
    p = 0
    while True:
        c = 2 * p + 1
        if c >= size:
            break
        if c + 1 < size and _before(hk, hr, hi, c + 1, c):
            c += 1
        if not _before(hk, hr, hi, c, p):
            break
        _swap(hk, hr, hi, c, p)
        p = c
    return size


def _lead_pays_its_price(xs, ys, terms, gains, a, b, fixed, per_token, step) -> bool:
    """Some prefix of the lead ``gains[a:b]`` raises the step's E / T with its fixed price paid."""
    tokens, rows = step[TOKENS], step[TREE_ROWS]
    bare = _forward(xs, ys, terms, tokens, rows)
    gained = 0.0
    for k in range(1, b - a + 1):
        gained += gains[a + k - 1]
        added = _forward(xs, ys, terms, tokens + k, rows) - bare + fixed + gained * per_token
        if gained * step[TIME] > step[EXPECTED] * added:
            return True
    return False


def _pieces(rows, cand_at, col_at, scalars, r, lead, first_column, out) -> int:
    """Request ``r``'s further pieces into ``out`` (rows x 5, best first, each kind in its order);
    returns how many (draft_rule's definition: candidates only add to a lead; window column 0
    below a bare root is a chain)."""
    cand_from, cand_to, col_to = cand_at[r], col_at[r], cand_at[r + 1]
    cand_gain, col_gain = scalars[r, CAND_GAIN], scalars[r, COL_GAIN]
    n_cand = 0
    if lead > 0 and cand_gain > 0:
        while cand_from + n_cand < cand_to and rows[cand_from + n_cand] > 0:
            n_cand += 1
    n_col = col_to - (cand_to + first_column) if col_gain > 0 else 0
    n_col = max(n_col, 0)
    i = j = m = 0
    while i < n_cand or j < n_col:
        c_rows = rows[cand_from + i] if i < n_cand else 0
        k = first_column + j
        w_rows = rows[cand_to + k] if j < n_col else 0
        c_key = cand_gain / c_rows if i < n_cand else 0.0
        w_key = col_gain / max(w_rows, 1) if j < n_col else 0.0
        if j >= n_col or (i < n_cand and c_key >= w_key):
            out[m, GAIN_PER_ROW], out[m, GAIN], out[m, ROWS] = c_key, cand_gain, c_rows
            out[m, CHAIN], out[m, CANDIDATE] = 0.0, 1.0
            i += 1
        else:
            out[m, GAIN_PER_ROW], out[m, GAIN], out[m, ROWS] = w_key, col_gain, w_rows
            out[m, CHAIN] = 1.0 if (k == 0 and lead == 0) else 0.0
            out[m, CANDIDATE] = 0.0
            j += 1
        m += 1
    return m


def plan(ints, floats, xs, ys, out):
    """Every request's plan into ``out`` (int64 ``(3, n)``: lead tokens, further candidates, window
    columns), the inputs packed in two arrays, so a step's call unboxes five arguments, not
    fourteen (each costs the caller's thread time on every step):
    ``ints`` = ``n``, ``len(gains)``, ``len(rows)``, then ``lead_at``, ``rows``, ``cand_at``,
    ``col_at``, ``present``; ``floats`` = the bare forward's tokens, the cost model's fitted terms
    (four, :meth:`~.step_cost.StepCost.terms`), then ``gains``, ``scalars`` (``4 n``, row-major)."""
    n, n_gains, n_rows = ints[0], ints[1], ints[2]
    a = 3
    lead_at = ints[a : a + n + 1]
    a += n + 1
    rows = ints[a : a + n_rows]
    a += n_rows
    cand_at = ints[a : a + n + 1]
    a += n + 1
    col_at = ints[a : a + n]
    present = ints[a + n : a + 2 * n]
    gains = floats[5 : 5 + n_gains]
    scalars = floats[5 + n_gains : 5 + n_gains + 4 * n].reshape((n, 4))
    terms, base_tokens = floats[1:5], floats[0]
    _plan(gains, lead_at, rows, cand_at, col_at, scalars, present, xs, ys, terms, base_tokens, out[0], out[1], out[2])


def plan_rows(ints, floats, head, xs, ys, out):
    """:func:`plan` of requests given one row each (:func:`~.batch_step.draft_batch`), laid out
    here as :meth:`~.draft_rule.StepOptions.add_request` lays them out: ``ints[r]`` = (lead
    tokens, further candidates, rows of each, window levels filled, window columns: 0 for none),
    ``floats[r]`` = (the lead's odds of a first and of a next token, candidate gain, window-column
    gain, fixed price, price per accepted token), ``head`` = (the bare forward's tokens, the cost
    model's four fitted terms).  A lead token's gain is ``first * next ** i``, multiplied out in
    the same order as there, so the same floats and the same plans."""
    n = ints.shape[0]
    n_gains = n_rows = 0
    for r in range(n):
        n_gains += ints[r, 0]
        n_rows += ints[r, 1] * ints[r, 2] + ints[r, 4]
    gains = np.empty(n_gains, dtype=np.float64)
    rows = np.empty(n_rows, dtype=np.int64)
    lead_at = np.empty(n + 1, dtype=np.int64)
    cand_at = np.empty(n + 1, dtype=np.int64)
    col_at = np.empty(n, dtype=np.int64)
    scalars = np.empty((n, 4), dtype=np.float64)
    present = np.ones(n, dtype=np.int64)
    g_at = r_at = 0
    for r in range(n):
        lead_at[r], cand_at[r] = g_at, r_at
        g, q = floats[r, 0], floats[r, 1]
        for _ in range(ints[r, 0]):
            gains[g_at] = g
            g_at += 1
            g *= q
        for _ in range(ints[r, 1]):
            rows[r_at] = ints[r, 2]
            r_at += 1
        col_at[r] = r_at
        if ints[r, 4] > 0:  # a window's first column has one row less: the root is its first level
            rows[r_at] = ints[r, 3] - 1
            r_at += 1
            for _ in range(ints[r, 4] - 1):
                rows[r_at] = ints[r, 3]
                r_at += 1
        for k in range(4):
            scalars[r, k] = floats[r, 2 + k]
    lead_at[n], cand_at[n] = g_at, r_at
    _plan(gains, lead_at, rows, cand_at, col_at, scalars, present, xs, ys, head[1:5], head[0], out[0], out[1], out[2])


def _plan(gains, lead_at, rows, cand_at, col_at, scalars, present, xs, ys, terms, base_tokens, lead, cands, cols):
    """:func:`plan` unpacked: every request's plan into ``lead``, ``cands``, ``cols`` (the layout
    of the inputs in the module docstring).  ``base_tokens``: the bare forward's tokens."""
    n = len(present)
    step = np.zeros(5, dtype=np.float64)
    step[TOKENS] = base_tokens
    step[EXPECTED] = max(base_tokens, float(n))
    step[TIME] = _forward(xs, ys, terms, max(base_tokens, 1.0), 0.0)
    for r in range(n):
        lead[r] = cands[r] = cols[r] = 0
        # a window still at its first level: column 0 is the root itself (no rows), free to run
        if present[r] and col_at[r] < cand_at[r + 1] and rows[col_at[r]] == 0 and scalars[r, COL_GAIN] > 0:
            cols[r] = 1
    _plan_leads(gains, lead_at, scalars, present, xs, ys, terms, step, lead)
    _drop_leads_that_lower_the_rate(gains, lead_at, scalars, present, xs, ys, terms, step, lead)
    _plan_branches(rows, cand_at, col_at, scalars, present, xs, ys, terms, step, lead, cands, cols)


def _plan_leads(gains, lead_at, scalars, present, xs, ys, terms, step, lead) -> None:
    """Phase 1: lead tokens, most likely first, while each adds more than its time costs."""
    n = len(present)
    hk = np.empty(n, dtype=np.float64)
    hr = np.empty(n, dtype=np.int64)
    hi = np.empty(n, dtype=np.int64)
    size = 0
    for r in range(n):
        a = lead_at[r]
        if present[r] and lead_at[r + 1] > a and gains[a] > 0:
            size = _push(hk, hr, hi, size, -gains[a], r, 1)
    while size > 0:
        size = _pop(hk, hr, hi, size)
        gain, r, i = -hk[size], hr[size], hi[size]
        a, b = lead_at[r], lead_at[r + 1]
        fixed, per_token = scalars[r, FIXED], scalars[r, PER_TOKEN]
        dt = _forward(xs, ys, terms, step[TOKENS] + 1, step[TREE_ROWS]) + step[FIXED_TOTAL] - step[TIME]
        dt = dt + gain * per_token
        if i == 1 and fixed > 0:
            if not _lead_pays_its_price(xs, ys, terms, gains, a, b, fixed, per_token, step):
                continue
            dt += fixed
            step[FIXED_TOTAL] += fixed
        elif gain * step[TIME] <= step[EXPECTED] * dt:
            continue  # this request's longer lead gains even less
        step[FIXED_TOTAL] += gain * per_token
        lead[r] = i
        step[TOKENS] += 1
        step[EXPECTED] += gain
        step[TIME] += dt
        if i < b - a:
            size = _push(hk, hr, hi, size, -gains[a + i], r, i + 1)


def _drop_leads_that_lower_the_rate(gains, lead_at, scalars, present, xs, ys, terms, step, lead) -> None:
    """Leads taken while paying an earlier lead's price that lower E / T in the end: dropped, the
    one whose removal raises E / T most first, until removing none would."""
    while True:
        rate, worst = step[EXPECTED] / step[TIME], -1
        drop_gained = drop_fixed = drop_time = 0.0
        for r in range(len(present)):
            fixed = scalars[r, FIXED]
            if not present[r] or lead[r] == 0 or fixed <= 0:
                continue
            gained = 0.0
            for k in range(lead[r]):
                gained += gains[lead_at[r] + k]
            left = step[FIXED_TOTAL] - fixed - gained * scalars[r, PER_TOKEN]
            t = _forward(xs, ys, terms, step[TOKENS] - lead[r], step[TREE_ROWS]) + left
            if (step[EXPECTED] - gained) > rate * t:
                rate, worst = (step[EXPECTED] - gained) / t, r
                drop_gained, drop_fixed, drop_time = gained, left, t
        if worst < 0:
            return
        step[TOKENS] -= lead[worst]
        step[EXPECTED], step[FIXED_TOTAL], step[TIME] = step[EXPECTED] - drop_gained, drop_fixed, drop_time
        lead[worst] = 0


def _plan_branches(rows, cand_at, col_at, scalars, present, xs, ys, terms, step, lead, cands, cols) -> None:
    """Phase 2: further candidates and window columns; each request takes the best prefix of its
    pieces if it raises E / T, requests whose first piece is most efficient first."""
    n = len(present)
    most = 0
    for r in range(n):
        most = max(most, cand_at[r + 1] - cand_at[r])
    pieces = np.empty((most, 5), dtype=np.float64)
    first = np.empty(n, dtype=np.float64)
    queued = np.zeros(n, dtype=np.bool_)
    for r in range(n):
        if present[r] and _pieces(rows, cand_at, col_at, scalars, r, lead[r], cols[r], pieces) > 0:
            first[r], queued[r] = -pieces[0, GAIN_PER_ROW], True
    order = np.nonzero(queued)[0]
    order = order[np.argsort(first[order], kind="mergesort")]  # ties: the request's order
    for r in order:
        m = _pieces(rows, cand_at, col_at, scalars, r, lead[r], cols[r], pieces)
        per_token = scalars[r, PER_TOKEN]
        expected = step[EXPECTED]
        best, best_at = expected / step[TIME], 0
        e, tok, rows_tree = expected, step[TOKENS], step[TREE_ROWS]
        fixed = step[FIXED_TOTAL] + (scalars[r, FIXED] if lead[r] == 0 else 0.0)  # its first draft pays its price
        for k in range(m):
            e, tok = e + pieces[k, GAIN], tok + pieces[k, ROWS]
            rows_tree = rows_tree + (0.0 if pieces[k, CHAIN] else pieces[k, ROWS])
            ratio = e / (_forward(xs, ys, terms, tok, rows_tree) + fixed + (e - expected) * per_token)
            if ratio > best:
                best, best_at = ratio, k + 1
        if best_at == 0:
            continue
        step[FIXED_TOTAL] = fixed
        for k in range(best_at):
            if pieces[k, CANDIDATE]:
                cands[r] += 1
            else:
                cols[r] += 1
            step[TOKENS] += pieces[k, ROWS]
            step[TREE_ROWS] += 0.0 if pieces[k, CHAIN] else pieces[k, ROWS]
            step[EXPECTED] += pieces[k, GAIN]
            step[FIXED_TOTAL] += pieces[k, GAIN] * per_token
        step[TIME] = _forward(xs, ys, terms, step[TOKENS], step[TREE_ROWS]) + step[FIXED_TOTAL]


def _sigmoid(z):
    """draft_rule._sigmoid."""
    return 1.0 / (1.0 + math.exp(-z)) if z > -30 else 0.0


def _lead_length(c, support, room, span, shift_first, shift_next, floor, first_table, next_table, slope, odds, r):
    """One lead of :func:`lead_lengths`: its odds into ``odds[r]``, its length returned."""
    odds[r, 0] = odds[r, 1] = 0.0
    if c <= 0 or room <= 0:
        return 0
    first = first_table[min(max(c, 1), len(first_table)) - 1] + slope * math.log(max(support, 1))
    p = _sigmoid(first + shift_first)
    q = _sigmoid(next_table[min(max(c, 1), len(next_table)) - 1] + shift_next)
    odds[r, 0], odds[r, 1] = p, q
    if p < floor or p <= 0:
        above = 0
    elif floor <= 0 or q >= 1:
        above = span
    elif q <= 0:
        above = 1
    else:
        above = min(span, 1 + int(math.log(floor / p) / math.log(q) + 1e-9))
    return min(room, span, 1 + above)


def lead_lengths(each, floats, first_table, next_table, slope, lengths, odds):
    """For each request ``r`` whose lookup found a lead after ``context`` tokens (0: none) with
    ``support`` in its own pools (``each[:, r]`` = (context, support, room, span), ``floats[r]`` =
    (the request's and pooled log-odds shift of a first token, of a next one, floor)): the rule's
    odds of it (:meth:`~.draft_rule.LeadConfidence.odds`; the fitted tables of own-text leads) into
    ``odds[r]``, and the length :meth:`~.request.RequestLookahead.lead_request` asks for under the
    rule into ``lengths[r]``: one more token than pay the floor
    (:meth:`~.draft_rule.LeadConfidence.tokens_above`), at most ``span`` and ``room`` (0 and no odds
    where nothing was found or there is no room).  The same operations in the same order as the
    Python, so the same floats."""
    for r in range(each.shape[1]):
        lengths[r] = _lead_length(
            each[0, r],
            each[1, r],
            each[2, r],
            each[3, r],
            floats[r, 0],
            floats[r, 1],
            floats[r, 2],
            first_table,
            next_table,
            slope,
            odds,
            r,
        )


# draft_rows' per-request numbers: its ints' columns, then its floats'
AT, ROW, LENGTH, ROOT, ROOM, SPAN, LIMIT, FILLED, COLUMNS = range(9)
SHIFT_FIRST, SHIFT_NEXT, CAND_RATE, COL_RATE, VERIFY_S, TOKEN_S = range(6)


def draft_rows(
    tables, ints, floats, head, logit_tables, tokens, xs, ys, found, found_sources, answers, odds, buf, sources, out
):
    """A batch step's lookups, leads and plan in one call (:func:`~.batch_step.draft_batch`):
    :func:`~.ngram_table.lookup_rows` of every request, :func:`lead_lengths` of what each found
    (the lead's context: the pools per request less the pool it came from), the leads grown to
    those lengths (:func:`~.ngram_table.grow_rows`) and :func:`plan_rows` of the options.
    Per request ``r``, ``ints[r]`` = (its block in ``tables``, its row and length in ``tokens``,
    root, room, lead span, candidate limit (-1: none), window levels filled and columns: 0 for
    none) and ``floats[r]`` = (its lead records' log-odds shifts, first and next, its candidate
    and window-column gains, its fixed price and price per accepted token); ``head`` = (the bare
    forward's tokens, the cost model's four fitted terms, the floor, the support slope, pools per
    request, the lookup's context, continuations per lookup); ``logit_tables`` = the fitted first-
    and next-token tables of own-text leads, one after the other (first's length first).  Out:
    the lookups (``found``, ``found_sources``, ``answers``), the leads' odds, ``buf`` /
    ``sources`` / ``answers[r, 3:5]`` as :func:`~.ngram_table.grow_rows` gives them (``t``,
    ``d``), ``out`` the plan (lead tokens, further candidates, window columns)."""
    R = ints.shape[0]
    count, context, limit = int(head[7]), int(head[8]), int(head[9])
    asks = np.empty((4, R), dtype=np.int64)  # the pools' loops' columns: block, row, length, root
    for r in range(R):
        asks[0, r], asks[1, r], asks[2, r], asks[3, r] = ints[r, AT], ints[r, ROW], ints[r, LENGTH], ints[r, ROOT]
    look = np.empty((R, 3), dtype=np.int64)  # lookup_rows' answers (a contiguous array: its one signature)
    _lookup_rows(tables, asks, count, tokens, context, limit, found, found_sources, look)
    answers[:, :3] = look
    want = _leads(answers, ints, floats, head, logit_tables, count, odds)
    grown = np.empty((R, 2), dtype=np.int64)
    _grow_rows(tables, asks, count, tokens, context, found, found_sources, want, buf, sources, grown)
    answers[:, 3:] = grown
    rows, gains = _options(ints, floats, answers, odds, found.shape[2])
    plan_rows(rows, gains, head[:5], xs, ys, out)


def _leads(answers, ints, floats, head, logit_tables, count, odds):
    """:func:`draft_rows`' leads: each request's length (returned) and odds (into ``odds``), as
    :func:`lead_lengths` gives them for what its lookup found (``answers[r, :3]``)."""
    R = ints.shape[0]
    n_first = int(logit_tables[0])
    first_table, next_table = logit_tables[1 : 1 + n_first], logit_tables[1 + n_first :]
    want = np.empty(R, dtype=np.int64)
    for r in range(R):
        c = count - answers[r, 1] if answers[r, 0] else 0  # pool p of a request matched count - p tokens
        want[r] = _lead_length(
            c,
            answers[r, 2],
            ints[r, ROOM],
            ints[r, SPAN],
            floats[r, SHIFT_FIRST],
            floats[r, SHIFT_NEXT],
            head[5],
            first_table,
            next_table,
            head[6],
            odds,
            r,
        )
    return want


def _options(ints, floats, answers, odds, width):
    """:func:`draft_rows`' options, one row each as :func:`plan_rows` reads them."""
    R = ints.shape[0]
    rows = np.empty((R, 5), dtype=np.int64)
    gains = np.empty((R, 6), dtype=np.float64)
    for r in range(R):
        d, n, cap = answers[r, 4], answers[r, 0], ints[r, LIMIT]
        most = n if cap < 0 else min(n, cap)
        rows[r, 0] = d
        rows[r, 1] = most - 1 if d else 0  # further candidates: the lead's siblings, N - 1 tokens each
        rows[r, 2] = width
        rows[r, 3], rows[r, 4] = ints[r, FILLED], ints[r, COLUMNS]
        gains[r, 0] = odds[r, 0] if d else 0.0
        gains[r, 1] = odds[r, 1] if d else 0.0
        for k in range(4):
            gains[r, 2 + k] = floats[r, CAND_RATE + k]
    return rows, gains


_INLINED = ("_chain", "_forward", "_before", "_swap", "_sigmoid", "_lead_length")  # compiled into their callers
_HELPERS = (
    "_leads",
    "_options",
    "_plan",
    "_push",
    "_pop",
    "_lead_pays_its_price",
    "_pieces",
    "_plan_leads",
    "_drop_leads_that_lower_the_rate",
    "_plan_branches",
)
LOOPS = ("plan", "plan_rows", "lead_lengths", "draft_rows")
loops = SimpleNamespace()  # the compiled LOOPS, once load() ran


def load() -> SimpleNamespace:
    """The compiled loop (numba, ``cache=True``), made on first use: see :func:`.ngram_table.load`."""
    if not vars(loops):
        from numba import njit

        module = globals()
        pools = load_pool_loops()  # draft_rows calls the pools' compiled loops
        module["_lookup_rows"], module["_grow_rows"] = pools.lookup_rows, pools.grow_rows
        for name in _INLINED:
            module[name] = njit(cache=True, inline="always")(module[name])
        for name in (*_HELPERS, *LOOPS):
            module[name] = njit(cache=True)(module[name])
        _drop_if_stale(module["draft_rows"], load_pool_loops.__code__.co_filename)
        for name in LOOPS:
            setattr(loops, name, module[name])
    return loops


_lookup_rows = _grow_rows = None  # ngram_table's lookup_rows and grow_rows, compiled (load)


def _drop_if_stale(dispatcher, dependency: str) -> None:
    """numba keys a function's cache on its own file alone, and a function it calls is compiled
    into it: a cached :func:`draft_rows` would keep the pools' loops it was compiled with after
    ``ngram_table.py`` changed.  Its cache is dropped (compiled again at its first call) where
    that file is newer than the cache's index."""
    try:
        index = dispatcher._cache._cache_file._index_path
        if os.path.exists(index) and os.path.getmtime(index) < os.path.getmtime(dependency):
            dispatcher._cache.flush()
    except (AttributeError, OSError):  # another numba's cache layout, or none: nothing to drop
        pass
