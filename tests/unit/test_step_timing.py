"""The worker's host price and rests (engine/step_timing.py: StepTiming.host_seconds,
.proposed, .resting): what the draft rule is told a drafting request's proposal costs, and when
a batch stops proposing for a while."""

from __future__ import annotations

import pytest

from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core.decayed import DecayedRatio
from vllm_lookahead.engine.step_timing import MAX_REST, StepTiming

ON = LookaheadConfig(price_host_work=True)


def _rests(timing: StepTiming, steps: int) -> list[bool]:
    return [timing.resting() for _ in range(steps)]


def test_a_decayed_ratio_is_a_mean_per_unit_that_forgets_the_past_geometrically():
    r = DecayedRatio(0.5)
    assert r.ratio is None
    r.add(6.0, 3)  # 2 per unit
    assert r.ratio == pytest.approx(2.0)
    r.add(1.0)  # (0.5 * 6 + 1) / (0.5 * 3 + 1)
    assert r.ratio == pytest.approx(4.0 / 2.5)
    for _ in range(60):
        r.add(5.0, 1)
    assert r.ratio == pytest.approx(5.0)


def test_the_host_price_is_the_proposals_seconds_per_decoding_request():
    timing = StepTiming(ON)
    assert timing.host_seconds(16) == 0.0  # nothing measured yet: the forward alone
    timing.proposed(0.004, 16, drafted=3)
    assert timing.host_seconds(16) == pytest.approx(0.004)
    assert timing.host_seconds(8) == pytest.approx(0.002)  # the proposal scales with the batch
    for _ in range(200):  # decayed: recent steps weigh most
        timing.proposed(0.001, 4, drafted=1)
    assert timing.host_seconds(4) == pytest.approx(0.001, rel=1e-3)
    timing.frozen = True  # tensor parallel: every rank must plan alike
    assert timing.host_seconds(4) == 0.0
    for _ in range(4):
        timing.proposed(0.004, 4, drafted=0)
    assert not any(_rests(timing, 4))


def test_plans_that_draft_nothing_twice_running_start_rests_that_double():
    timing = StepTiming(ON)
    timing.proposed(0.002, 8, drafted=0)
    assert _rests(timing, 2) == [False, False]  # one drafting-free plan is not enough
    timing.proposed(0.002, 8, drafted=0)
    assert _rests(timing, 2) == [True, False]
    timing.proposed(0.002, 8, drafted=0)
    timing.proposed(0.002, 8, drafted=0)
    assert _rests(timing, 3) == [True, True, False]
    timing.proposed(0.002, 8, drafted=0)
    timing.proposed(0.002, 8, drafted=2)  # a plan that drafted: the next rest is short again
    timing.proposed(0.002, 8, drafted=0)
    timing.proposed(0.002, 8, drafted=0)
    assert _rests(timing, 2) == [True, False]
    for _ in range(20):
        timing.proposed(0.002, 8, drafted=0)
        timing.proposed(0.002, 8, drafted=0)
        _rests(timing, MAX_REST)
    timing.proposed(0.002, 8, drafted=0)
    timing.proposed(0.002, 8, drafted=0)
    assert sum(_rests(timing, 2 * MAX_REST)) == MAX_REST  # never longer


def test_a_plan_without_any_candidate_does_not_count_towards_a_rest():
    timing = StepTiming(ON)
    for _ in range(4):
        timing.proposed(0.002, 8, drafted=0, offered=False)
    assert not any(_rests(timing, 4))
    assert timing.host_seconds(8) == pytest.approx(0.002)  # its proposal was still timed


def test_no_rest_where_proposing_is_cheap_next_to_the_forward():
    timing = StepTiming(ON)
    forward = timing.model().forward(4)
    for _ in range(6):  # 1 % of the forward: a rest would save little and could miss a draft
        timing.proposed(0.01 * forward, 4, drafted=0)
    assert not any(_rests(timing, 4))
    for _ in range(60):  # 5 %: rests
        timing.proposed(0.05 * forward, 4, drafted=0)
    assert any(_rests(timing, 4))


def test_off_it_prices_nothing_and_never_rests():
    for config in (LookaheadConfig(), LookaheadConfig(price_host_work=True, max_tokens_per_step=64)):
        timing = StepTiming(config)
        for _ in range(4):
            timing.proposed(0.004, 16, drafted=0)
        assert timing.host_seconds(16) == 0.0 and not any(_rests(timing, 4))


def test_each_verified_tree_prices_its_kind_and_leaves_the_forwards_clock(monkeypatch):
    """A tree's verification (greedy and sampled apart) is the draft rule's fixed price per
    drafting request; the step's clock, which prices rows, no longer carries it."""
    from types import SimpleNamespace

    import torch

    from vllm_lookahead.core.step_cost import StepCost
    from vllm_lookahead.engine import step_timing

    timing = StepTiming(LookaheadConfig())
    assert timing.verify_seconds(True) == timing.verify_seconds(False) == 0.0  # nothing measured yet
    timing.cost = StepCost.linear(0.010, 0.001)
    seen = []
    monkeypatch.setattr(StepCost, "observe", lambda self, tokens, rows, seconds: seen.append(seconds))
    clock = iter([100.0, 100.020])  # the step: 20 ms from _prepare_inputs to sampled
    monkeypatch.setattr(step_timing.time, "perf_counter", lambda: next(clock))
    timing.step_started(SimpleNamespace(scheduled_spec_decode_tokens={"a": [1], "b": [2]},
                                        num_scheduled_tokens={"a": 2, "b": 2}, total_num_scheduled_tokens=4))
    timing.verified([SimpleNamespace(greedy=False, seconds=0.003), SimpleNamespace(greedy=True, seconds=0.001)])
    timing.step_sampled(torch.zeros(1))
    assert seen == [pytest.approx(0.016)]
    assert timing.verify_seconds(False) == pytest.approx(0.003) and timing.verify_seconds(True) == pytest.approx(0.001)
    for _ in range(200):  # decayed: recent trees weigh most
        timing.verified([SimpleNamespace(greedy=False, seconds=0.002)])
    assert timing.verify_seconds(False) == pytest.approx(0.002, rel=1e-3)
    timing.frozen = True  # tensor parallel: every rank must plan alike
    assert timing.verify_seconds(False) == 0.0
    off = StepTiming(LookaheadConfig(price_verification=False))
    off.verified([SimpleNamespace(greedy=False, seconds=0.003)])
    assert off.verify_seconds(False) == 0.0


def test_an_idle_request_may_rest_only_where_proposing_is_a_large_share_of_the_step():
    from vllm_lookahead.core.step_cost import StepCost
    from vllm_lookahead.engine.step_timing import REQUEST_MAX_REST

    timing = StepTiming(LookaheadConfig())
    timing.cost = StepCost.linear(0.020, 0.0005)  # 20 ms + 0.5 ms a token
    assert timing.request_rest(16) == 0  # nothing measured yet
    timing.proposed_for(0.0016, 16)  # 0.1 ms a request: 1.6 ms at 16 in flight, 5.8 % of 28 ms
    assert timing.request_rest(16) == REQUEST_MAX_REST
    assert timing.request_rest(1) == 0  # 0.1 ms of a 20.5 ms step: 0.5 %
    timing.frozen = True  # tensor parallel: every rank must plan alike
    assert timing.request_rest(16) == 0
    assert StepTiming(LookaheadConfig(rest_idle_requests=False)).request_rest(16) == 0
