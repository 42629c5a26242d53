"""The worker's prices and rests (engine/propose/step_timing.py: StepTiming.verify_seconds,
.request_rest): what the draft rule is told verifying a request's tree costs, and when an idle
request stops proposing for a while -- both under the draft rule only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core.decayed import DecayedRatio
from vllm_lookahead.engine.propose.step_timing import StepTiming, decode_only


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


def _tree(greedy: bool, seconds: float, accepted: int = 0, sampling_seconds: float = 0.0):
    from types import SimpleNamespace

    return SimpleNamespace(
        greedy=greedy, seconds=seconds, path=list(range(1, accepted + 1)), sampling_seconds=sampling_seconds
    )


def test_each_verified_tree_prices_its_kind_and_leaves_the_forwards_clock(monkeypatch):
    """A tree's verification (greedy and sampled apart) is the draft rule's fixed price per
    drafting request, a sampled walk's sampling a price per accepted token; the step's clock,
    which prices rows, carries neither."""
    from types import SimpleNamespace

    import torch

    from vllm_lookahead.core.step_cost import StepCost
    from vllm_lookahead.engine.propose import step_timing

    timing = StepTiming(LookaheadConfig())
    assert timing.verify_seconds(True) == timing.verify_seconds(False) == 0.0  # nothing measured yet
    timing.cost = StepCost.linear(0.010, 0.001)
    seen = []
    monkeypatch.setattr(StepCost, "observe", lambda self, tokens, rows, seconds: seen.append(seconds))
    clock = iter([100.0, 100.020])  # the step: 20 ms from _prepare_inputs to sampled
    monkeypatch.setattr(step_timing.time, "perf_counter", lambda: next(clock))
    timing.step_started(
        SimpleNamespace(
            scheduled_spec_decode_tokens={"a": [1], "b": [2]},
            num_scheduled_tokens={"a": 2, "b": 2},
            total_num_scheduled_tokens=4,
        )
    )
    assert timing.token_seconds(False) == 0.0
    # a sampled tree: 3 ms of its own, 2 ms sampling the tokens after its 2 accepted nodes
    timing.verified([_tree(False, 0.003, accepted=2, sampling_seconds=0.002), _tree(True, 0.001, accepted=3)])
    timing.step_sampled(torch.zeros(1))
    assert seen == [pytest.approx(0.014)]
    assert timing.verify_seconds(False) == pytest.approx(0.003) and timing.verify_seconds(True) == pytest.approx(0.001)
    assert timing.token_seconds(False) == pytest.approx(0.001) and timing.token_seconds(True) == 0.0
    for _ in range(200):  # decayed: recent trees weigh most; a tree that accepted nothing sampled nothing
        timing.verified([_tree(False, 0.002), _tree(False, 0.002, accepted=1, sampling_seconds=0.0015)])
    assert timing.verify_seconds(False) == pytest.approx(0.002, rel=1e-3)
    assert timing.token_seconds(False) == pytest.approx(0.0015, rel=1e-3)
    timing.frozen = True  # tensor parallel: every rank must plan alike
    assert timing.verify_seconds(False) == timing.token_seconds(False) == 0.0
    capped = StepTiming(LookaheadConfig(max_tokens_per_step=64))  # no draft rule: nothing priced
    capped.verified([_tree(False, 0.003, accepted=1, sampling_seconds=0.001)])
    assert capped.verify_seconds(False) == capped.token_seconds(False) == 0.0


def test_an_idle_request_may_rest_only_where_proposing_is_a_large_share_of_the_step():
    from vllm_lookahead.core.step_cost import StepCost
    from vllm_lookahead.engine.propose.step_timing import REQUEST_MAX_REST, REQUEST_REST_LIMIT

    timing = StepTiming(LookaheadConfig())
    timing.cost = StepCost.linear(0.020, 0.0005)  # 20 ms + 0.5 ms a token
    assert timing.request_rest(16) == 0  # nothing measured yet
    timing.proposed_for(0.0016, 16)  # 0.1 ms a request: 1.6 ms at 16 in flight, 5.8 % of 28 ms
    assert timing.request_rest(16) == REQUEST_MAX_REST
    assert timing.request_rest(1) == 0  # 0.1 ms of a 20.5 ms step: 0.5 %
    assert timing.request_rest(400) == 10  # 40 ms for a 220 ms step: 18 %; resting 10 of 11 proposals, 1.6 %
    timing.proposed_for(0.096, 16)  # proposing now costs more than the forward: the longest rest
    assert timing.request_rest(400) == REQUEST_REST_LIMIT
    timing.frozen = True  # tensor parallel: every rank must plan alike
    assert timing.request_rest(16) == 0
    capped = StepTiming(LookaheadConfig(max_tokens_per_step=0))  # full trees: no draft rule, no rests
    capped.proposed_for(0.0016, 16)
    assert capped.request_rest(16) == 0


def test_a_decode_only_step_schedules_one_token_per_request_plus_its_drafts():
    def step(counts, spec=None):
        return SimpleNamespace(num_scheduled_tokens=counts, scheduled_spec_decode_tokens=spec)

    assert not decode_only(step({}))
    assert decode_only(step({"a": 1, "b": 1})) and decode_only(step({"a": 1, "b": 1}, {}))
    assert not decode_only(step({"a": 1, "b": 7}))  # b's prefill chunk
    assert decode_only(step({"a": 3, "b": 1}, {"a": [5, 6]}))
    assert not decode_only(step({"a": 3, "b": 2}, {"a": [5, 6]}))
