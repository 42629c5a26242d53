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
    tokens, steps, drafted = replay(prompt, output, lambda p: LookaheadCandidates(params, 2, p))
    assert tokens == 30
    # once "1 2 3" has been seen, every step accepts both drafted tokens plus the bonus
    assert steps <= 1 + 3 + (30 - 4) // 3 + 2
    assert drafted <= 2 * (steps - 1)
    assert replay(prompt, [], lambda p: LookaheadCandidates(params, 2, p)) == (0, 0, 0)
    assert replay(prompt, [4], lambda p: LookaheadCandidates(params, 2, p)) == (1, 1, 0)


def test_replay_without_drafts_is_one_token_per_forward():
    params = LookaheadConfig(window_size=2, ngram_size=3, guess_set_size=2)
    output = list(range(40))  # nothing repeats: no candidate is ever right
    assert replay([100], output, lambda p: LookaheadCandidates(params, 4, p))[:2] == (40, 40)
