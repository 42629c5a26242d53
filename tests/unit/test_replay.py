"""Replaying recorded greedy outputs through drafters (bench/replay.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.bench.replay import LookaheadCandidates, accepted_by, replay
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
    from vllm_lookahead.bench.replay import tree_rows
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
