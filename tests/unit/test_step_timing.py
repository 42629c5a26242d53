"""The worker's host price and rests (engine/step_timing.py: StepTiming.host_seconds,
.proposed, .resting): what the draft rule is told a drafting request's proposal costs, and when
a batch stops proposing for a while."""

from __future__ import annotations

import pytest

from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.engine.step_timing import MAX_REST, StepTiming

ON = LookaheadConfig(price_host_work=True)


def _rests(timing: StepTiming, steps: int) -> list[bool]:
    return [timing.resting() for _ in range(steps)]


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
