"""The tree speculative-sampling rule (core/sampling.py), checked exactly and statistically.

Exactly: for random trees and random target distributions over a small vocabulary, the
probability of every emitted token sequence under the rule is computed by enumeration and
compared with the target's own probability of it.  Statistically: the chi-square harness
(tests/support/stats.py) that the engine tests use accepts the rule and rejects
three deliberately wrong ones -- the tests of the test.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.stats import compare_samples, sequence_histograms
from support.wrong_rules import WRONG_RULES
from vllm_lookahead.core import TreeBuilder
from vllm_lookahead.core.sampling import (
    Forest,
    child_carrying,
    children_with_logits,
    coupled_walk,
    coupled_walks,
    sample_from,
    tree_speculative_sample,
)
from vllm_lookahead.core.tree import DraftTree

VOCAB = 5


class TableModel:
    """p(next | last two tokens): a random table with some zero entries (like top-k/top-p masks)."""

    def __init__(self, seed: int, vocab: int = VOCAB) -> None:
        rng = np.random.default_rng(seed)
        table = rng.dirichlet(np.full(vocab, 0.7), size=(vocab, vocab))
        table[rng.random(table.shape) < 0.25] = 0.0
        table[..., 0] += 1e-3  # never an all-zero row
        self.table = table / table.sum(-1, keepdims=True)

    def __call__(self, context: tuple[int, ...]) -> np.ndarray:
        return self.table[context[-2], context[-1]]


def node_contexts(tree: DraftTree, context: tuple[int, ...]) -> list[tuple[int, ...]]:
    texts = [context]
    for node in range(1, tree.size):
        texts.append(texts[int(tree.parents[node])] + (int(tree.tokens[node]),))
    return texts


def exact_rule_distribution(tree: DraftTree, probs: list[np.ndarray]) -> dict[tuple[int, ...], float]:
    """P(the step emits this token sequence) under the rule, by enumeration."""
    children = children_with_logits(tree)
    out: dict[tuple[int, ...], float] = {}

    def walk(node: int, prefix: tuple[int, ...], weight: float) -> None:
        r = probs[node].astype(np.float64).copy()
        for child in children[node]:
            x = int(tree.tokens[child])
            total = r.sum()
            if r[x] <= 0:
                continue
            walk(child, prefix + (x,), weight * r[x] / total)
            weight *= 1 - r[x] / total
            r[x] = 0.0
        total = r.sum()
        for token in np.flatnonzero(r > 0):
            key = prefix + (int(token),)
            out[key] = out.get(key, 0.0) + weight * r[token] / total

    walk(0, (), 1.0)
    return out


def random_tree(rng: np.random.Generator, root: int, size: int, vocab: int = VOCAB) -> DraftTree:
    b = TreeBuilder(root)
    while b.size < size:
        b.add(int(rng.integers(0, b.size)), int(rng.integers(0, vocab)), bool(rng.random() < 0.8))
    return b.build()


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30))
def test_the_child_a_walk_moves_to_is_the_first_child_with_logits_carrying_the_token(seed, size):
    tree = random_tree(np.random.default_rng(seed), 1, size)
    children = children_with_logits(tree)
    for node in range(tree.size):
        for token in range(VOCAB):
            first = next((c for c in children[node] if int(tree.tokens[c]) == token), None)
            assert child_carrying(tree, node, token) == first


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.lists(st.integers(1, 30), min_size=1, max_size=6))
def test_a_round_s_children_looked_up_for_every_walk_at_once_are_child_carrying_s(seed, sizes):
    """The lookup :func:`coupled_walks` makes for all its walks at once (:meth:`Forest.first_children`)
    answers every (walk, node, token) as :func:`child_carrying` does in that walk's tree."""
    rng = np.random.default_rng(seed)
    trees = [random_tree(rng, int(rng.integers(VOCAB)), size) for size in sizes]
    queries = [(w, node, token) for w, t in enumerate(trees) for node in range(t.size) for token in range(VOCAB)]
    walk, node, token = (np.array(column, dtype=np.int64) for column in zip(*queries))
    found = Forest(trees).first_children(walk, node, token).tolist()
    expected = [child_carrying(trees[w], n, t) for w, n, t in queries]
    assert found == [-1 if c is None else c for c in expected]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 12))
def test_the_rule_emits_exactly_the_target_distribution(seed, size):
    rng = np.random.default_rng(seed)
    model = TableModel(seed)
    context = (int(rng.integers(VOCAB)), int(rng.integers(VOCAB)))
    tree = random_tree(rng, context[-1], size)
    contexts = node_contexts(tree, context)
    emitted = exact_rule_distribution(tree, [model(c) for c in contexts])
    assert abs(sum(emitted.values()) - 1.0) < 1e-9
    # The step's output is a prefix of the continuation: compare the first-token marginal and,
    # extending each emitted sequence by the target itself, the first two and three tokens.
    for length in (1, 2, 3):
        got: dict[tuple[int, ...], float] = {}
        for seq, prob in emitted.items():
            for tail, tail_prob in _continuations(model, context + seq, length - len(seq)):
                key = (seq + tail)[:length]
                got[key] = got.get(key, 0.0) + prob * tail_prob
        want = dict(_continuations(model, context, length))
        keys = set(got) | set(want)
        assert max(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in keys) < 1e-9


def _continuations(model, context, length):
    """(tokens, probability) of every continuation of ``length`` tokens under the target."""
    if length <= 0:
        yield (), 1.0
        return
    p = model(context)
    for token in np.flatnonzero(p > 0):
        for tail, q in _continuations(model, context + (int(token),), length - 1):
            yield (int(token),) + tail, float(p[token]) * q


def test_sample_from_respects_the_support_at_the_edges():
    r = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    assert sample_from(r, 1.0, 0.0) == 1
    assert sample_from(r, 1.0, 0.4999) == 1
    assert sample_from(r, 1.0, 0.5) == 3
    assert sample_from(r, 1.0, 1.0 - 1e-16) == 3
    assert sample_from(r, 1.0 + 1e-12, 1.0 - 1e-16) == 3  # rounding past the end stays in the support


def test_leaf_and_root_only_trees():
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.0])
    rng = np.random.default_rng(0)
    path, token = tree_speculative_sample(DraftTree.chain([7]), {0: p}, rng.random)
    assert path.size == 0 and p[token] > 0


# -- the statistical harness, and wrong rules it must reject ----------------------------------

Rule = Callable[[DraftTree, Callable[[int], np.ndarray], Callable[[], float]], tuple[np.ndarray, int]]


def simulate(rule: Rule, model: TableModel, context, tree_maker, samples: int, length: int, seed: int):
    """``samples`` continuations of ``length`` tokens: one drafted step by ``rule``, then the target."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(samples):
        tree = tree_maker(context)
        probs = [model(c) for c in node_contexts(tree, context)]
        path, last = rule(tree, probs.__getitem__, rng.random)
        seq = [int(t) for t in tree.tokens[path]] + [int(last)]
        while len(seq) < length:
            p = model(context + tuple(seq))
            seq.append(sample_from(p, 1.0, rng.random()))
        out.append(seq[:length])
    return out


def branching_tree(model: TableModel) -> Callable[[tuple], DraftTree]:
    """Two candidates sharing a first token (merged), one more, and a 'window' chain without logits."""

    def make(context):
        root = context[-1]
        likely = np.argsort(-model(context))
        b = TreeBuilder(root)
        b.add_chain(0, [int(likely[0]), int(likely[1]), 2], True, merge=True)
        b.add_chain(0, [int(likely[0]), int(likely[0]), 1], True, merge=True)
        b.add_chain(0, [int(likely[1]), 3], True, merge=True)
        b.add_chain(0, [4, 4], False)
        return b.build()

    return make


def gumbel_max(p: np.ndarray, uniform: Callable[[], float]) -> int:
    """A Gumbel-max sample of ``p`` (``argmax(p / q)``, ``q`` exponential: the same), one
    position's noise = one uniform per vocabulary entry."""
    noise = np.array([uniform() for _ in range(len(p))])
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(p) - np.log(-np.log(noise))))


def coupled_rule(tree: DraftTree, probs: Callable[[int], np.ndarray], uniform: Callable[[], float]):
    """The coupled walk with the root's token sampled first, as the engine's sampler does."""
    return coupled_walk(tree, gumbel_max(probs(0), uniform), lambda node: gumbel_max(probs(node), uniform))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 14), steps=st.integers(1, 4))
def test_the_coupled_walk_emits_what_sampling_with_the_same_noise_emits(seed, size, steps):
    """Per position one noise, in order: the walk's tokens are token for token those of plain
    sampling that draws the same stream -- a seeded request reproduces -- and the stream has
    advanced by exactly one position per emitted token, whatever the tree."""
    rng = np.random.default_rng(seed)
    model = TableModel(seed)
    context = (int(rng.integers(VOCAB)), int(rng.integers(VOCAB)))
    noise = rng.random((128, VOCAB))
    plain, used = [], 0
    while len(plain) < 64:  # sampling without speculation
        plain.append(gumbel_max(model(context + tuple(plain)), iter(noise[used]).__next__))
        used += 1
    walked, used, accepted = [], 0, 0
    for _ in range(steps):  # drafted steps: a tree that holds the true continuation at times
        text = context + tuple(walked)
        b = TreeBuilder(text[-1])
        truth = plain[len(walked) : len(walked) + size]
        b.add_chain(0, [int(t) for t in truth[: int(rng.integers(1, size)) if size > 1 else 0]], True, merge=True)
        while b.size < size:
            b.add(int(rng.integers(0, b.size)), int(rng.integers(0, VOCAB)), bool(rng.random() < 0.8))
        tree = b.build()
        probs = [model(c) for c in node_contexts(tree, text)]
        draws = iter(noise[used:].reshape(-1))
        path, last = coupled_rule(tree, probs.__getitem__, draws.__next__)
        emitted = [int(t) for t in tree.tokens[path]] + [last]
        used += len(emitted)
        accepted += len(path)
        walked += emitted
        assert walked == plain[: len(walked)]
    assert used == len(walked)
    assert accepted >= (steps if size > 1 else 0)  # the true continuation's first token is always drafted


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), walks=st.integers(1, 6))
def test_walks_taken_together_are_the_walks_taken_alone(seed, walks):
    """Several trees walked a position at a time, each with its own noise stream: every walk's
    path, last token and draws are those of the same walk alone, and each round samples once
    for every walk still going (those that moved), in walk order."""
    rng = np.random.default_rng(seed)
    model = TableModel(seed)
    trees, streams = [], []
    for _ in range(walks):
        trees.append(random_tree(rng, int(rng.integers(VOCAB)), int(rng.integers(1, 12))))
        streams.append(rng.random((16, VOCAB)))

    def stream_sampler(w: int):
        draws = iter(streams[w].reshape(-1))
        return lambda node: gumbel_max(model((w % VOCAB, int(trees[w].tokens[node]))), draws.__next__)

    firsts = [int(rng.integers(VOCAB)) for _ in range(walks)]
    alone = [coupled_walk(trees[w], firsts[w], stream_sampler(w)) for w in range(walks)]
    samplers = [stream_sampler(w) for w in range(walks)]
    rounds: list[list[int]] = []

    def sample_after(reached):
        rounds.append([w for w, _ in reached])
        return [samplers[w](node) for w, node in reached]

    together = coupled_walks(list(zip(trees, firsts)), sample_after)
    assert [(p.tolist(), t) for p, t in together] == [(p.tolist(), t) for p, t in alone]
    assert all(r == sorted(r) and r for r in rounds)
    assert sum(len(r) for r in rounds) == sum(len(p) for p, _ in alone)  # one draw per accepted node


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), sizes=st.lists(st.integers(1, 20), min_size=1, max_size=5))
def test_followed_nodes_are_those_reached_through_each_parent_s_next_token(seed, sizes):
    """:meth:`Forest.followed`: node by node in each tree, a node is reached iff it has logits,
    carries its parent's next token and its parent is reached (roots are)."""
    rng = np.random.default_rng(seed)
    trees = [random_tree(rng, int(rng.integers(VOCAB)), size) for size in sizes]
    forest = Forest(trees)
    next_token = rng.integers(0, VOCAB, forest.size)
    expected = []
    for w, tree in enumerate(trees):
        mine = next_token[forest.offsets[w] : forest.offsets[w] + tree.size]
        reached = [True]
        for node in range(1, tree.size):
            parent = int(tree.parents[node])
            reached.append(bool(tree.logits[node]) and reached[parent] and int(tree.tokens[node]) == mine[parent])
        expected += reached
    assert forest.followed(next_token).tolist() == expected


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), walks=st.integers(1, 6))
def test_walks_take_the_tokens_drawn_ahead_and_ask_for_the_others_only(seed, walks):
    """With ``drawn`` holding, at some nodes, the token the sampler gives there, the walks are
    those without it, and ``sample_after`` is asked exactly for the reached nodes not drawn."""
    rng = np.random.default_rng(seed)
    trees = [random_tree(rng, int(rng.integers(VOCAB)), int(rng.integers(1, 14))) for _ in range(walks)]
    forest = Forest(trees)
    table = rng.integers(0, VOCAB, forest.size)  # the token the sampler gives after each node
    walked = list(zip(trees, rng.integers(0, VOCAB, walks).tolist()))
    asked: list[tuple[int, int]] = []

    def sample_after(reached):
        asked.extend(reached)
        return [int(table[forest.offsets[w] + node]) for w, node in reached]

    alone = coupled_walks(walked, sample_after)
    reached = set(asked)
    asked.clear()
    drawn = np.where(rng.random(forest.size) < 0.5, table, -1)
    ahead = coupled_walks(walked, sample_after, forest, drawn)
    assert [(p.tolist(), t) for p, t in ahead] == [(p.tolist(), t) for p, t in alone]
    assert sorted(asked) == sorted((w, n) for w, n in reached if drawn[forest.offsets[w] + n] < 0)


def coupled_rule_drawing_ahead(tree: DraftTree, probs: Callable[[int], np.ndarray], uniform: Callable[[], float]):
    """The coupled walk with tokens drawn before it, each with noise of its own, at every node
    reached through the most likely tokens (the root's own token sampled first), as the engine
    does for requests without a seed."""
    first = gumbel_max(probs(0), uniform)
    forest = Forest([tree])
    likeliest = np.array([int(np.argmax(probs(node))) if tree.logits[node] else -1 for node in range(tree.size)])
    likeliest[0] = first
    drawn = np.full(tree.size, -1, dtype=np.int64)
    for node in np.flatnonzero(forest.followed(likeliest))[1:].tolist():
        drawn[node] = gumbel_max(probs(node), uniform)
    [walk] = coupled_walks(
        [(tree, first)], lambda reached: [gumbel_max(probs(n), uniform) for _, n in reached], forest, drawn
    )
    return walk


@pytest.mark.parametrize("name", ["the rule", "the coupled rule", "the coupled rule drawing ahead", *WRONG_RULES])
def test_the_chi_square_harness_accepts_the_rule_and_rejects_wrong_ones(name):
    rules = {
        "the rule": tree_speculative_sample,
        "the coupled rule": coupled_rule,
        "the coupled rule drawing ahead": coupled_rule_drawing_ahead,
    }
    rule, should_pass = (rules[name], True) if name in rules else (WRONG_RULES[name], False)
    model = TableModel(seed=3)
    context = (1, 2)
    make = branching_tree(model)
    reference = simulate(
        lambda t, p, u: (np.zeros(0, np.int64), sample_from(p(0), 1.0, u())), model, context, make, 3000, 3, seed=11
    )
    candidate = simulate(rule, model, context, make, 3000, 3, seed=12)
    report = compare_samples(sequence_histograms(reference, 3), sequence_histograms(candidate, 3), alpha=1e-3)
    assert report.passed == should_pass, report.summary()


def test_chi_square_survival_function_matches_tables():
    from support.stats import chi2_sf

    # 95 % and 99 % quantiles from standard tables
    for x, dof, p in ((3.841459, 1, 0.05), (18.307038, 10, 0.05), (6.634897, 1, 0.01), (37.566235, 20, 0.01)):
        assert abs(chi2_sf(x, dof) - p) < 1e-6
    assert chi2_sf(0.0, 3) == 1.0 and chi2_sf(1e4, 3) < 1e-100
