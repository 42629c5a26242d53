"""Replaying recorded greedy outputs through drafters (benchmarks/replay.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.replay import LookaheadCandidates, accepted_by, measured_cost, replay, replay_cost
from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core.tree import TreeBuilder


@settings(max_examples=200, deadline=None)
@given(
    chains=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), max_size=4),
    truth=st.lists(st.integers(0, 3), min_size=1, max_size=8),
    merge=st.booleans(),
)
def test_accepted_is_the_longest_candidate_prefix_the_truth_confirms(chains, truth, merge):
    builder = TreeBuilder(9)
    for chain in chains:
        builder.add_chain(0, chain, needs_logits=True, merge=merge)
    tree = builder.build()

    def prefix(chain):
        n = 0
        while n < len(chain) and n < len(truth) and chain[n] == truth[n]:
            n += 1
        return n

    assert accepted_by(tree, truth) == max([0, *map(prefix, chains)])


def test_replay_counts_the_prefill_token_and_learns_the_loop():
    params = LookaheadConfig(window_size=2, ngram_size=3, guess_set_size=2, lookup_context=2)
    prompt = [5, 6]
    output = [1, 2, 3] * 10
    tokens, steps, drafted, _ = replay(prompt, output, lambda p: LookaheadCandidates(params, 2, p))
    assert tokens == 30
    # once "1 2 3" has been seen, every step accepts both drafted tokens plus the bonus
    assert steps <= 1 + 3 + (30 - 4) // 3 + 2
    assert drafted <= 2 * (steps - 1)
    assert replay(prompt, [], lambda p: LookaheadCandidates(params, 2, p)) == (0, 0, 0, 0.0)
    assert replay(prompt, [4], lambda p: LookaheadCandidates(params, 2, p))[:3] == (1, 1, 0)


def test_replay_without_drafts_is_one_token_per_forward():
    params = LookaheadConfig(window_size=2, ngram_size=3, guess_set_size=2)
    output = list(range(40))  # nothing repeats: no candidate is ever right
    assert replay([100], output, lambda p: LookaheadCandidates(params, 4, p))[:2] == (40, 40)


def test_replay_times_each_step_under_the_cost_model_and_the_rule_uses_it():
    from benchmarks.replay import tree_rows
    from vllm_lookahead.core.step_cost import StepCost
    from vllm_lookahead.core.tree import TreeBuilder

    b = TreeBuilder(0)
    b.add_chain(0, [1, 2, 3], needs_logits=True)
    assert tree_rows(b.build()) == 0  # a chain: no tree pass
    b.add_chain(0, [4, 5], needs_logits=True)
    assert tree_rows(b.build()) == 2
    params = LookaheadConfig(window_size=0, ngram_size=3, guess_set_size=2)
    cost = StepCost.linear(0.010, 0.001)
    output = [1, 2, 3] * 10
    tokens, steps, drafted, seconds = replay([5, 6], output, lambda p: LookaheadCandidates(params, None, p, cost), cost)
    assert tokens == 30 and steps < 20 and drafted > 0
    assert seconds < tokens * cost.forward(1)  # fewer, slightly longer forwards: faster by the model
    dear = StepCost((1, 256), (0.010, 5.0))  # drafts never pay: the rule drafts nothing
    assert replay([5, 6], output, lambda p: LookaheadCandidates(params, None, p, dear))[:3] == (30, 30, 0)


def test_suffix_replay_drafts_from_the_prompt_and_from_earlier_responses():
    """vLLM's suffix drafter as replay runs it (needs arctic-inference, the `suffix` extra)."""
    import pytest

    pytest.importorskip("arctic_inference")
    from benchmarks.replay import SuffixDecoding

    suffix = SuffixDecoding({"method": "suffix"})
    loop = [7, 8, 9, 10, 11, 12]
    # the prompt holds the loop: once a step has matched it, the rest is drafted whole
    tokens, steps, drafted, _ = replay([1, *loop], loop * 2, suffix)
    assert tokens == 12 and steps < 6 and drafted >= 8
    # a new request whose prompt lacks the text: drafted from the first request's response
    tokens, steps_again, _, _ = replay([2, 3], [4, *loop, 5], suffix)
    assert steps_again <= 4  # without the cache: 8 forwards, one per token
    fresh = SuffixDecoding({"method": "suffix", "suffix_decoding_max_cached_requests": 0})
    assert replay([2, 3], [4, *loop, 5], fresh)[1] == 8


def test_replayed_shared_pool_drafts_a_new_request_from_an_earlier_output():
    from benchmarks.replay import _lookahead_engine

    loop = [7, 8, 9, 10, 11, 12]
    for shared, most_steps in ((False, 8), (True, 4)):
        params = LookaheadConfig(window_size=0, guess_set_size=1, max_tokens_per_step=8, shared_pool=shared)
        engine = _lookahead_engine(params, 8, None)  # one engine: its requests one after another
        replay([1], [4, *loop * 2], engine)
        # the new prompt lacks the loop: only the shared pool has it from the first request's output
        steps = replay([2, 3], [4, *loop, 5], engine)[1]
        assert steps == most_steps if not shared else steps <= most_steps


def test_measured_cost_is_the_recordings_batch1_step_time_per_size():
    timers = lambda sizes: {
        **{f"forward{n}_s": s * c for n, (s, c) in sizes.items()},
        **{f"forward{n}_calls": float(c) for n, (s, c) in sizes.items()},
    }
    workloads = [
        {"name": "code", "concurrency": 1},
        {"name": "qa", "concurrency": 1},
        {"name": "code@c4", "concurrency": 4},
    ]
    raw = {
        "workloads": workloads,
        "methods": [
            {"runs": {"code": [{"timers": timers({1: (0.030, 100)})}, {"timers": timers({1: (0.034, 100)})}]}},
            {
                "runs": {
                    "code": [{"timers": {**timers({1: (0.036, 50), 5: (0.045, 40), 9: (0.2, 3)}), "step_s": 9.0}}],
                    # several requests per forward: not batch-1 steps
                    "code@c4": [{"timers": timers({5: (0.5, 100), 12: (0.060, 100)})}],
                }
            },
            {"runs": {"qa": [{"timers": timers({5: (0.050, 60)})}]}},  # a tree method: dearer at the same size
        ],
    }
    cost = measured_cost(raw)
    assert cost.tokens == (1, 5)  # size 9 was seen 3 times only; size 12 only at 4 in flight
    assert cost.seconds[0] == pytest.approx(0.032)  # a method's runs pooled; the cheapest method per size
    assert cost.seconds[1] == pytest.approx(0.045)
    assert replay_cost("measured", raw).tokens == (1, 5)
    with pytest.raises(ValueError):
        measured_cost({"workloads": workloads, "methods": [{"runs": {"code": [{"timers": {"step_s": 1.0}}]}}]})
