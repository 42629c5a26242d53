"""The cost-aware draft rule (core/draft_rule.py) and its forward-cost model (core/step_cost.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.draft_plan_reference import plan_step_reference
from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import RequestLookahead, greedy_verify
from vllm_lookahead.core.draft_rule import (
    Acceptance,
    DraftOptions,
    DraftPlan,
    LeadConfidence,
    PooledConfidence,
    StepOptions,
    lead_floor,
    plan_step,
)
from vllm_lookahead.core.draft_rule import (
    LeadEvidence as E,
)
from vllm_lookahead.core.step_cost import StepCost


# -- the cost model -------------------------------------------------------------------------
def test_chain_cost_interpolates_and_extrapolates_with_the_last_slope():
    cost = StepCost((1, 8, 32), (0.020, 0.025, 0.043))
    assert cost.forward(1) == 0.020 and cost.forward(8) == 0.025
    assert abs(cost.forward(20) - 0.034) < 1e-12  # halfway between 8 and 32
    assert abs(cost.forward(56) - 0.061) < 1e-12  # past 32: 0.75 ms per token
    assert cost.forward(8, tree_rows=0) == cost.forward(8)


def test_observed_steps_set_the_scale_and_the_tree_row_price():
    cost = StepCost((1, 32), (0.020, 0.043))
    for _ in range(50):
        cost.observe(1, 0, 0.040)  # real chain steps take twice the profile
    assert abs(cost.scale - 2.0) < 1e-9
    assert cost.token_seconds == 0.0  # steps of one size cannot tell a per-token price from the scale
    for _ in range(50):
        cost.observe(20, 10, 2.0 * cost.chain(20) + 10 * 0.001)  # trees: +1 ms per recomputed row
    assert abs(cost.tree_row_seconds - 0.001) < 1e-6
    assert abs(cost.forward(20, 10) - (2.0 * cost.chain(20) + 0.010)) < 1e-6
    again = StepCost.from_dict(cost.to_dict())
    assert abs(again.forward(20, 10) - cost.forward(20, 10)) < 1e-6


# This CPU's start-up profile is flat over a few tokens (1 to 4 tokens ~20 ms: the dummy forward's
# GEMMs at a few rows, no attention), while a real decode step pays 0.5-1.7 ms for each further token.
FLAT_PROFILE = ((1, 2, 4, 8, 16), (0.020, 0.020, 0.020, 0.022, 0.027))


def test_real_steps_teach_the_per_token_price_the_profile_misses():
    cost = StepCost(*FLAT_PROFILE)
    for n in (1, 2, 5, 1, 4, 8, 1, 3) * 5:
        cost.observe(n, 0, 1.8 * cost.chain(n) + 0.0015 * (n - 1))
    # within the prior's pull towards the profile (a few per cent against 40 steps of evidence)
    assert cost.scale == pytest.approx(1.8, rel=0.02) and cost.token_seconds == pytest.approx(0.0015, rel=0.03)
    assert cost.forward(5) - cost.forward(1) == pytest.approx(
        1.8 * (cost.chain(5) - cost.chain(1)) + 4 * 0.0015, rel=0.03
    )
    again = StepCost.from_dict(cost.to_dict())
    assert again.forward(3) == pytest.approx(cost.forward(3)) and again.forward(40) == pytest.approx(cost.forward(40))
    cheaper = StepCost(*FLAT_PROFILE)
    for n in (1, 4, 8, 16) * 5:  # real tokens cheaper than the profile's: no negative price
        cheaper.observe(n, 0, cheaper.chain(n) - 0.0001 * (n - 1))
    assert cheaper.token_seconds == 0.0 and cheaper.forward(16) >= cheaper.forward(8) >= cheaper.forward(1)


def test_one_slow_step_moves_the_model_no_further_than_a_step_three_times_its_prediction():
    steady, spiked, capped = (StepCost(*FLAT_PROFILE) for _ in range(3))
    for cost in (steady, spiked, capped):
        for n in (1, 2, 5, 1, 4, 8, 1, 3) * 5:
            cost.observe(n, 0, 1.8 * cost.chain(n) + 0.0015 * (n - 1))
    predicted = spiked.forward(5)
    spiked.observe(5, 0, 50 * predicted)  # a first call's warm-up, the core taken away
    capped.observe(5, 0, 3 * predicted)
    assert spiked.forward(5) == pytest.approx(capped.forward(5)) and spiked.forward(5) > steady.forward(5)
    tree, tree_capped = StepCost(*FLAT_PROFILE), StepCost(*FLAT_PROFILE)
    tree.observe(8, 4, 100 * tree.forward(8))  # the first tree step of a fresh engine
    tree_capped.observe(8, 4, 3 * tree_capped.forward(8))
    assert tree.tree_row_seconds == pytest.approx(tree_capped.tree_row_seconds)


def test_a_per_token_price_pushed_up_by_slow_drafted_steps_fades_back_when_none_are_drafted(monkeypatch):
    """At batch 1 only drafted steps tell the per-token price apart from the scale.  A few slow
    ones (measured on the toy test model: 0.6 ms steps, drafted ones up to 3x slower on a busy
    core) price a certain draft token above a bare step, so nothing is drafted and no new
    evidence comes; the prior lets the stale estimate fade back to the profile's, so drafting is
    tried again, while without it the price would stay where the slow steps left it."""
    from vllm_lookahead.core import step_cost

    def stuck() -> StepCost:
        cost = StepCost((1, 2, 4, 8, 16), (0.0005,) * 4 + (0.0006,))
        for _ in range(3):
            for n in (1, 1, 4, 1, 3):
                cost.observe(n, 0, 0.0006 + 0.0012 * (n - 1))  # 1.2 ms per drafted token
        return cost

    def pays(cost: StepCost) -> bool:  # StepTiming.any_draft_pays at batch 1
        return cost.forward(1) > cost.forward(2) - cost.forward(1)

    cost = stuck()
    assert not pays(cost)
    undrafted = 0
    while not pays(cost) and undrafted < 500:
        cost.observe(1, 0, 0.0006)
        undrafted += 1
    assert 20 <= undrafted <= 150, undrafted
    monkeypatch.setattr(step_cost, "PER_TOKEN_PRIOR_WEIGHT", 0.0)
    cost = stuck()
    for _ in range(500):
        cost.observe(1, 0, 0.0006)
    assert not pays(cost)


def test_the_window_is_left_out_once_real_steps_price_its_tokens():
    """A window column below a bare root is a 3-token chain.  Priced by the flat profile it is
    free, and a free piece pays for any gain however small, so the window ran on most steps that
    had no candidate and returned nothing.  Priced as real steps cost, it is left out; a lead
    likely to be accepted still pays."""
    column = DraftOptions(window_column_rows=(3, 4, 4), window_column_gain=0.005)
    lead = DraftOptions(lead_gains=(0.9, 0.8, 0.7))
    cost = StepCost(*FLAT_PROFILE)
    assert plan_step([column], cost) == [DraftPlan(window_columns=1)]
    for n in (1, 2, 5, 1, 4, 8, 1, 3) * 5:
        cost.observe(n, 0, 1.8 * cost.chain(n) + 0.0015 * (n - 1))
    assert plan_step([column], cost) == [DraftPlan()]
    assert plan_step([lead], cost) == [DraftPlan(lead=3)]


def test_a_slow_spell_while_profiling_does_not_flatten_the_profile(monkeypatch):
    """Forwards cost 20 ms + 1 ms per token; the first six take 30 ms more (start-up, another
    process on the cores).  Timed size after size, they would all fall on the 1-token size: made
    non-decreasing, the curve would call every size up to ~30 tokens free."""
    from types import SimpleNamespace

    from vllm_lookahead.engine.propose import cost_profile

    clock = SimpleNamespace(now=0.0, calls=0)

    def dummy_run(tokens):
        clock.calls += 1
        clock.now += 0.020 + 0.001 * tokens + (0.030 if clock.calls <= 6 else 0.0)
        return np.zeros((tokens, 4)), None

    runner = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=64),
        device="cpu",
        _dummy_run=dummy_run,
        model=SimpleNamespace(compute_logits=lambda hidden: hidden),
    )
    monkeypatch.setattr(cost_profile.time, "perf_counter", lambda: clock.now)
    cost = cost_profile.profile_forward_cost(runner)
    assert cost.tokens == (1, 2, 4, 8, 16, 32, 64)
    assert cost.seconds == pytest.approx([0.020 + 0.001 * n for n in cost.tokens])


def test_one_size_timed_slow_in_every_round_does_not_make_drafts_dear():
    """A profile seen in CI (2026-11-28, another process on the cores): 2 tokens timed 5.7 ms in
    every round beside 1.4 ms at 1 and 1.5 ms at 4.  Carried up by the non-decreasing curve it
    priced every draft at four times a 1-token forward and nothing drafted at batch 1; each size
    is the lowest time seen at it or above."""
    from vllm_lookahead.engine.propose.cost_profile import lower_envelope

    seen = [1.4, 5.7, 1.5, 1.3, 2.4, 1.9, 2.0, 7.9]
    assert lower_envelope(seen) == [1.3, 1.3, 1.3, 1.3, 1.9, 1.9, 2.0, 7.9]
    cost = StepCost((1, 2, 4, 8, 16, 32, 64, 128), tuple(1e-3 * s for s in lower_envelope(seen)))
    assert cost.chain(4) == pytest.approx(cost.chain(1))
    assert lower_envelope([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]


# -- the rule -------------------------------------------------------------------------------
def _opts(
    lead=8, p=0.6, q=0.8, cands=(4, 4, 4), cand_gain=0.1, cols=(3, 4, 4), col_gain=0.1, fixed=0.0, per_accepted=0.0
) -> DraftOptions:
    return DraftOptions(
        tuple(p * q**i for i in range(lead)),
        tuple(cands),
        cand_gain,
        tuple(cols),
        col_gain,
        fixed_seconds=fixed,
        token_seconds=per_accepted,
    )


FREE = StepCost.linear(0.010, 0.0)  # every token free: a GPU far below its knee
DEAR = StepCost.linear(0.0, 0.010)  # time proportional to tokens: a draft never pays


def test_free_tokens_draft_everything_dear_tokens_nothing():
    full = plan_step([_opts()], FREE)
    assert full == [DraftPlan(lead=8, candidates=3, window_columns=3)]
    assert plan_step([_opts()], DEAR) == [DraftPlan()]


def test_cpu_like_costs_draft_a_chain_and_leave_the_tree_out():
    # ~0.7 ms per token on a 20 ms forward, 1 ms per tree row: the lead chain pays, a
    # candidate or window column adding 0.1 tokens for 4 rows does not.
    cpu = StepCost.linear(0.0193, 0.0007, tree_row=0.001)
    (plan,) = plan_step([_opts(p=0.6, q=0.9)], cpu)
    assert plan.lead == 8 and plan.candidates == 0 and plan.window_columns == 0
    (unlikely,) = plan_step([_opts(p=0.6, q=0.3)], cpu)
    assert 0 < unlikely.lead < 8  # the tail of an unlikely lead is cut


def test_a_full_batch_drafts_less_per_request_and_eventually_nothing():
    cost = StepCost.linear(0.015, 0.0008)
    leads = [sum(p.lead for p in plan_step([_opts(p=0.4, q=0.6)] * n, cost)) / n for n in (1, 4, 16, 64)]
    assert leads == sorted(leads, reverse=True) and leads[0] > leads[-1]
    assert plan_step([_opts(p=0.02, q=0.5)] * 64, cost) == [DraftPlan()] * 64


def test_warming_window_column_zero_is_free_and_candidates_need_the_lead():
    (plan,) = plan_step([_opts(lead=0, cols=(0, 1, 1))], FREE)
    assert plan == DraftPlan(lead=0, candidates=0, window_columns=3)
    (plan,) = plan_step([_opts(lead=0, cols=())], FREE)
    assert plan.candidates == 0  # no lead: no further candidates


def test_a_request_drafts_only_where_its_draft_pays_the_price_of_verifying_its_tree():
    """Verifying a sampled request's tree costs the host a fixed time whatever its size: a one-token
    draft likely to be accepted pays its forward row, not that price; a long likely lead pays
    both; a request priced out leaves the others' plans as they were."""
    cost = StepCost.linear(0.035, 0.0008)  # 32 in flight on the 2-core CPU: ~61 ms a step
    others = [None] * 30  # requests with nothing to draft
    one_token = _opts(lead=1, p=0.6, cands=(), cols=())
    long_lead = _opts(lead=12, p=0.95, q=0.97, cands=(), cols=())
    assert plan_step([*others, one_token, one_token], cost)[-1].lead == 1
    priced = replace(one_token, fixed_seconds=0.003)
    assert plan_step([*others, priced, priced], cost)[-2:] == [DraftPlan()] * 2
    assert plan_step([*others, one_token, replace(long_lead, fixed_seconds=0.003)], cost)[-1].lead > 4
    free = plan_step([*others, long_lead, one_token], cost)
    mixed = plan_step([*others, long_lead, priced], cost)
    assert mixed[-1] == DraftPlan() and mixed[-2].lead >= free[-2].lead
    column = _opts(lead=0, cands=(), cols=(3, 4, 4), col_gain=0.2)  # no lead: the window's pieces pay it
    assert plan_step([column], StepCost.linear(0.060, 0.0))[0].window_columns == 3
    assert plan_step([replace(column, fixed_seconds=0.05)], StepCost.linear(0.060, 0.0)) == [DraftPlan()]


def test_a_sampled_request_pays_for_sampling_each_token_it_expects_accepted():
    """Sampling the token after each accepted one (a sampled request's walk) costs per expected
    accepted token, not per tree: a lead's likely first token still pays, its unlikely tail no
    longer does, and a price above what a token saves the batch drafts nothing."""
    cost = StepCost.linear(0.060, 0.002)  # ~8 in flight on one core: 2 ms a draft token
    others = [None] * 7
    lead = _opts(lead=6, p=0.5, q=0.6, cands=(), cols=())
    free = plan_step([*others, lead], cost)[-1].lead
    priced = plan_step([*others, replace(lead, token_seconds=0.003)], cost)[-1].lead
    assert 0 < priced < free
    assert plan_step([*others, replace(lead, token_seconds=0.008)], cost)[-1] == DraftPlan()
    column = _opts(lead=0, cands=(), cols=(3, 4, 4), col_gain=0.2)  # the window's pieces pay it too
    assert plan_step([column], StepCost.linear(0.060, 0.0))[0].window_columns == 3
    assert plan_step([replace(column, token_seconds=0.4)], StepCost.linear(0.060, 0.0)) == [DraftPlan()]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 12),
            st.floats(0, 1),
            st.floats(0, 1),
            st.integers(0, 3),
            st.floats(0, 2),
            st.integers(0, 4),
            st.floats(0, 1),
            st.floats(0, 0.01),
            st.floats(0, 0.005),
        ),
        min_size=1,
        max_size=6,
    ),
    st.floats(0.001, 0.05),
    st.floats(0, 0.005),
    st.floats(0, 0.005),
)
def test_plans_fit_the_options_and_never_lose_by_the_model(reqs, base, per_token, per_row):
    options = [
        _opts(
            lead=l,
            p=p,
            q=q,
            cands=(3,) * c,
            cand_gain=g,
            cols=(2,) + (3,) * max(0, w - 1) if w else (),
            col_gain=cg,
            fixed=f,
            per_accepted=s,
        )
        for l, p, q, c, g, w, cg, f, s in reqs
    ]
    cost = StepCost.linear(base, per_token, tree_row=per_row)
    plans = plan_step(options, cost)
    n = len(options)
    expected, tokens, rows, fixed = float(n), n, 0, 0.0
    for o, plan in zip(options, plans):
        assert 0 <= plan.lead <= o.lead and plan.candidates <= len(o.candidate_rows)
        assert plan.window_columns <= len(o.window_column_rows)
        assert plan.candidates == 0 or plan.lead > 0
        gained = sum(o.lead_gains[: plan.lead]) + plan.candidates * o.candidate_gain
        gained += plan.window_columns * o.window_column_gain
        expected += gained
        fixed += gained * o.token_seconds  # sampling the token after each accepted one
        extra = sum(o.candidate_rows[: plan.candidates]) + sum(o.window_column_rows[: plan.window_columns])
        tokens += plan.lead + extra
        fixed += o.fixed_seconds if plan.lead + extra > 0 else 0.0  # a request with a tree to verify
        # window column 0 below a bare root (no lead) is a chain: no tree rows
        rows += extra - (o.window_column_rows[0] if plan.lead == 0 and plan.window_columns else 0)
    # Every piece was added only if it raised expected tokens per second, and a drafting step pays
    # each drafting request's verification and its accepted tokens' sampling too.
    spent = cost.forward(tokens, rows) + fixed
    assert expected / spent >= n / cost.forward(n) * (1 - 1e-9)


_gain = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.8, 1.0]) | st.floats(0, 1)  # ties are common
_option = st.one_of(
    st.none(),
    st.builds(
        DraftOptions,
        lead_gains=st.lists(_gain, max_size=12).map(lambda g: tuple(sorted(g, reverse=True))),
        candidate_rows=st.lists(st.integers(0, 6), max_size=4).map(tuple),
        candidate_gain=_gain | st.floats(0, 2),
        window_column_rows=st.lists(st.integers(0, 5), max_size=5).map(tuple),
        window_column_gain=_gain,
        fixed_seconds=st.sampled_from([0.0, 0.0, 0.001]) | st.floats(0, 0.01),
        token_seconds=st.sampled_from([0.0, 0.0, 0.001]) | st.floats(0, 0.005),
    ),
)


@st.composite
def _cost(draw) -> StepCost:
    """A profiled forward (one point or several), maybe fitted to chain steps, maybe with tree prices."""
    sizes = sorted(draw(st.sets(st.integers(1, 300), min_size=1, max_size=5)))
    times = draw(st.lists(st.floats(1e-4, 0.1), min_size=len(sizes), max_size=len(sizes)))
    cost = StepCost(tuple(sizes), tuple(times), tree_row_prior=draw(st.floats(0, 0.003)))
    cost.tree_step_seconds = draw(st.sampled_from([0.0, 0.0, 2e-4, 0.002]))
    for tokens, seconds in draw(st.lists(st.tuples(st.integers(1, 200), st.floats(1e-4, 0.2)), max_size=4)):
        cost.observe(tokens, 0, seconds)
    return cost


@settings(max_examples=400, deadline=None)
@given(st.lists(_option, max_size=24), _cost(), st.integers(0, 64) | st.none())
def test_the_compiled_plan_is_the_rules_plan(options, cost, extra):
    """plan_step's compiled walk makes the plans the rule's definition, written out in Python
    (tests/support/draft_plan_reference.py), makes: the same sums in the same order, the same ties."""
    base = None if extra is None else len(options) + extra
    assert plan_step(options, cost, base_tokens=base) == plan_step_reference(options, cost, base_tokens=base)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1),
            st.floats(0, 1),
            st.integers(0, 12),
            st.lists(st.integers(1, 6), max_size=4),
            st.integers(0, 4),
            st.integers(1, 5),
            st.floats(0, 2),
            st.floats(0, 0.01),
        ),
        max_size=12,
    ),
    _cost(),
)
def test_a_step_lays_out_what_the_rule_plans_from_records(requests, cost):
    """What a step appends per request (StepOptions.add_request: a lead's odds, a window's fill)
    is the DraftOptions the rule is defined on, and plans as those records do."""
    step, records = StepOptions(), []
    for p, q, lead, cand_rows, size, filled, gain, fixed in requests:
        step.add_request((p, q), lead, cand_rows, gain, filled, size, gain / 2, fixed, fixed / 3)
        cols = (filled - 1, *(filled,) * (size - 1)) if size else ()
        gains = LeadConfidence().gains(E(), lead, (p, q))
        records.append(DraftOptions(gains, tuple(cand_rows), gain, cols, gain / 2, fixed, fixed / 3))
    assert [step.options(r) for r in range(len(step))] == records
    assert [DraftPlan(*plan) for plan in zip(*step.plan(cost))] == plan_step(records, cost)


def test_the_compiled_plan_breaks_ties_as_the_rule_does():
    """Equal gains everywhere: the earlier request goes first, for leads and for further pieces."""
    same = _opts(lead=6, p=0.5, q=1.0, cands=(3, 3), cand_gain=0.4, cols=(2, 3, 3), col_gain=0.4)
    for cost in (StepCost.linear(0.010, 0.0002, tree_row=0.0004), StepCost.linear(0.02, 0.001)):
        for n in (2, 5, 17):
            options = [same] * n
            assert plan_step(options, cost) == plan_step_reference(options, cost)


# -- acceptance estimates ----------------------------------------------------------------------
def test_acceptance_splits_first_and_next_tokens():
    acc = Acceptance()
    for _ in range(40):
        acc.observe(lead=4, lead_accepted=0, candidates=0, accepted=0, window_columns=0, window_accepted=0)
    assert acc.lead.first(E(1, 1)) < 0.05 and acc.lead.next(E(1)) == pytest.approx(LeadConfidence().next(E(1)))
    for _ in range(40):
        acc.observe(lead=8, lead_accepted=8, candidates=0, accepted=8, window_columns=0, window_accepted=0)
    assert acc.lead.next(E(1)) > 0.95  # next tokens: always accepted once tried
    gains = acc.lead.gains(E(3, 2), 8)
    assert len(gains) == 8 and all(a >= b for a, b in zip(gains, gains[1:]))  # P(first i accepted) falls


def test_lead_confidence_follows_the_evidence_and_the_request():
    fresh = LeadConfidence()
    # a longer matched context and more support: likelier (the fitted priors, core/fitted.json)
    assert fresh.first(E(1, 1)) < fresh.first(E(1, 5)) < fresh.first(E(2, 5)) < fresh.first(E(3, 5))
    assert fresh.first(E(1, 1)) < fresh.first(E(2, 1)) < fresh.first(E(3, 1))
    for context in (1, 2, 3):
        by_support = [fresh.first(E(context, s)) for s in (1, 2, 4, 8, 64)]
        assert all(a < b for a, b in zip(by_support, by_support[1:])) and 0.0 < by_support[0] and by_support[-1] < 1.0
    assert (
        fresh.first(E(1, 1)) < 0.5 < fresh.first(E(3, 1))
    )  # a one-token match seen once is a guess, three tokens are not
    assert fresh.next(E(1)) < fresh.next(E(2)) < fresh.next(E(3)) and fresh.first(E(9, 1)) == fresh.first(E(3, 1))
    # a request whose confident leads keep failing is believed less, one whose weak leads hit more
    doubtful, lucky = LeadConfidence(), LeadConfidence()
    for _ in range(30):
        doubtful.observe(E(3, 4), tried=4, accepted=0)
        lucky.observe(E(1, 1), tried=4, accepted=4)
    assert doubtful.first(E(3, 4)) < 0.5 < fresh.first(E(3, 4))
    assert lucky.first(E(1, 1)) > 0.5 > fresh.first(E(1, 1)) and lucky.next(E(1)) > fresh.next(E(1))
    assert doubtful.next(E(3)) == fresh.next(E(3))  # no next token was ever tried


def test_a_shared_pool_lead_is_trusted_less_than_the_same_evidence_in_the_requests_own_text():
    fresh = LeadConfidence()
    for context in (1, 2, 3):
        for support in (1, 2, 5, 20):
            own, shared = E(context, support), E(context, support, shared=True)
            assert 0.0 < fresh.first(shared) < fresh.first(own)
        assert 0.0 < fresh.next(E(context, shared=True)) < fresh.next(E(context))
        # more support raises a shared lead too, and a longer match
        assert fresh.first(E(context, 1, shared=True)) < fresh.first(E(context, 5, shared=True))
    assert fresh.first(E(1, 1, shared=True)) <= fresh.first(E(3, 1, shared=True))


def test_the_candidate_and_window_priors_are_small_gains():
    """Before any outcome, a further candidate or window column is believed to add a fraction of a
    token (a lead's first token, the likeliest piece, is worth more) and rates only follow outcomes."""
    acc = Acceptance()
    options_gain = (acc.candidate.value, acc.window_column.value)
    assert all(0.0 < g < LeadConfidence().first(E(1, 1)) for g in options_gain)
    for _ in range(40):
        acc.observe(lead=0, lead_accepted=0, candidates=4, accepted=4, window_columns=2, window_accepted=2)
    assert acc.candidate.value > options_gain[0] and acc.window_column.value > options_gain[1]


def _decode(state: RequestLookahead, text: list[int], cost: StepCost, start: int) -> tuple[int, list[int]]:
    """Greedy decode ``text[start:]`` (the model's output, known in advance) with the rule at
    batch 1; returns (forwards, lead tokens drafted per step)."""
    history = list(text[:start])
    steps, drafted = 0, []
    while len(history) < len(text):
        cands = state.step_candidates(history[-1], history[-3:])
        (plan,) = plan_step([state.draft_options(cands)], cost)
        draft = state.build(cands, lead=plan.lead, candidates=plan.candidates, window_columns=0)
        truth = text[len(history) :]
        tree = draft.tree
        argmax = np.full(tree.size, -1)
        on = np.zeros(tree.size, bool)
        on[0] = True
        argmax[0] = truth[0]
        for v in range(1, tree.size):
            d = int(tree.depths[v])
            if on[tree.parents[v]] and d <= len(truth) and tree.tokens[v] == truth[d - 1]:
                on[v] = True
                argmax[v] = truth[d] if d < len(truth) else -1
        path, bonus = greedy_verify(tree, argmax)
        new = [*tree.tokens[path].tolist(), bonus]
        history += new
        if tree.size > 1:
            state.observe(draft, tree.size, argmax, new, history, path)
        else:
            state.catch_up(history)
        steps += 1
        drafted.append(draft.lead_tokens)
    return steps, drafted


def test_a_request_the_rule_stopped_drafting_drafts_again_when_its_text_repeats():
    # Novel text first (the pools' guesses are all wrong: the rule stops drafting), then a
    # loop: the left-out lead tokens are still checked against what the model emitted, so the
    # rule sees them become right and drafts again.
    rng = np.random.default_rng(0)
    novel = [int(t) for t in rng.integers(100, 120, 200)]
    loop = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 12
    text = [50, 51, 52, *novel, *loop]
    state = RequestLookahead(LookaheadConfig(), text[:3], seed=0)
    cost = StepCost.linear(0.0193, 0.0007, tree_row=0.001)
    steps, drafted = _decode(state, text, cost, 3)
    novel_steps = drafted[:150]
    assert np.mean(novel_steps[50:]) < 1.5  # mostly stopped drafting in the noise (its leads: ~2 % accepted)
    assert sum(1 for d in novel_steps[50:] if d == 0) > 30
    assert max(drafted[-8:]) >= 8  # and long leads again in the loop
    assert steps < len(text) - 3 - 60  # the loop was decoded several tokens per forward


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=30, max_size=120),
    st.floats(0.005, 0.05),
    st.floats(0.0, 0.004),
    st.integers(1, 16),
)
def test_the_lead_floor_only_skips_tokens_the_rule_would_never_draft(text, base, per_token, batch):
    """Lead tokens below lead_floor are not looked up; the plan is the same as with the whole lead."""
    cost = StepCost.linear(base, per_token)
    floor = lead_floor(cost, batch, LookaheadConfig().lead_tokens)
    state = RequestLookahead(LookaheadConfig(), text[:10], seed=0)
    for i in range(10, len(text)):
        history = text[:i]
        cut = state.step_candidates(history[-1], history[-3:], min_gain=floor)
        whole = state.step_candidates(history[-1], history[-3:])
        assert cut.lead == whole.lead[: len(cut.lead)]
        others = [state.draft_options(whole, window=False)] * batch
        (plan_whole, *_) = plan_step(others, cost, base_tokens=batch)
        (plan_cut, *_) = plan_step([state.draft_options(cut, window=False)] + others[1:], cost, base_tokens=batch)
        assert plan_cut.lead == plan_whole.lead < len(cut.lead) or plan_cut.lead == plan_whole.lead == len(whole.lead)
        state.catch_up(history)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.floats(0, 0.5), st.integers(0, 40), st.integers(0, 6))
def test_tokens_above_counts_the_gains_over_a_floor(context, support, floor, length, misses):
    conf = LeadConfidence()
    for _ in range(misses):
        conf.observe(E(context, support), tried=3, accepted=1)
    assert conf.tokens_above(E(context, support), floor, length) == sum(
        1 for g in conf.gains(E(context, support), length) if g >= floor
    )


@settings(max_examples=150, deadline=None)
@given(
    seconds=st.lists(st.floats(0.001, 0.2), min_size=1, max_size=6),
    base=st.integers(1, 40),
    span=st.integers(0, 40),
    observed=st.lists(st.tuples(st.integers(1, 60), st.floats(0.001, 0.3)), max_size=5),
)
def test_lead_floor_is_the_cheapest_marginal_token_over_the_bare_forward(seconds, base, span, observed):
    """The O(1) lead floor (cached per range, the measured scale cancelling) is its definition."""
    cost = StepCost(tuple(2**i for i in range(len(seconds))), tuple(seconds))
    for _ in range(2):  # the second pass reads the cache, after the scale moved
        forward = [cost.forward(base + i) for i in range(span + 1)]
        cheapest = min((b - a for a, b in zip(forward, forward[1:])), default=0.0)
        assert abs(lead_floor(cost, base, span) - max(0.0, cheapest) / forward[0]) < 1e-9
        for tokens, took in observed:
            cost.observe(tokens, 0, took)


def test_drafted_leads_accepted_less_than_expected_lower_every_requests_estimate_of_that_kind():
    """The pooled record compares each drafted lead with what the request's own estimate expected
    of it and shifts every request of the kind by the difference: a new request starts there, a
    checked-only first token (not drafted) does not count, and once drafted leads are accepted as
    expected, or none is drafted for long, the shift fades."""
    pooled = PooledConfidence()
    for k in range(240):  # short requests whose drafted leads go a third as far as expected
        LeadConfidence(pooled=pooled).observe(E(3, 4), tried=4, accepted=k % 3)
    fresh, model = LeadConfidence(pooled=pooled), LeadConfidence()
    assert fresh.first(E(3, 4)) < model.first(E(3, 4)) and fresh.next(E(3)) < 0.5 * model.next(E(3))
    assert pooled.first.shift < 0 and pooled.next.shift < 0 and pooled.first.tries > 100
    tries = pooled.first.tries
    fresh.observe(E(1, 1), tried=1, accepted=0, drafted=False)
    assert pooled.first.tries == tries  # a left-out token checked: the request's record only
    rng = np.random.default_rng(0)
    for _ in range(1000):  # then steps whose one drafted lead is accepted as often as the lead model says
        pooled.age()
        LeadConfidence(pooled=pooled).observe(E(3, 4), tried=1, accepted=int(rng.random() < model.first(E(3, 4))))
    assert abs(pooled.first.shift) < 0.6  # from -1.8 (binomial noise of ~200 leads: +-0.3)
    for _ in range(1000):  # or nothing drafted at all: the record fades back to no shift
        pooled.age()
    assert abs(pooled.first.shift) < 0.05 and abs(pooled.next.shift) < 0.05
    assert LeadConfidence(pooled=PooledConfidence()).first(E(2, 3)) == model.first(E(2, 3))  # empty pool: the model


def test_requests_decoding_without_being_offered_count_in_what_a_draft_token_adds():
    """A batch of 16 decoding requests of which one is offered (the others have no room, are not
    eligible, or rest) values that one's draft tokens against the 16 tokens the step emits anyway:
    its lead is cut shorter than if it were the batch's only request."""
    cost = StepCost.linear(0.020, 0.0008)
    option = DraftOptions(lead_gains=tuple(0.95 * 0.8**i for i in range(12)))
    (alone,) = plan_step([option], cost, base_tokens=1)
    (among_16,) = plan_step([option], cost, base_tokens=16)
    assert 0 < among_16.lead < alone.lead
    (default,) = plan_step([option], cost)
    assert default.lead == alone.lead  # without base_tokens: one token per request offered
