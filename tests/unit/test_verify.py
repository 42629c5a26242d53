"""greedy_verify: hand examples and a brute-force DFS reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core import DraftTree, TreeBuilder, greedy_verify


def test_full_match_of_a_candidate_yields_n_tokens():
    ngram_size = 5
    # root 10, candidate continuation 11 12 13 14 (N - 1 = 4 drafts)
    tree = DraftTree.chain([10, 11, 12, 13, 14])
    argmax = np.array([11, 12, 13, 14, 15])
    path, bonus = greedy_verify(tree, argmax)
    assert path.tolist() == [1, 2, 3, 4]
    assert bonus == 15
    accepted = tree.tokens[path].tolist() + [bonus]
    assert accepted == [11, 12, 13, 14, 15]
    assert len(accepted) == ngram_size


def test_no_match_returns_root_argmax():
    tree = DraftTree.chain([10, 11, 12])
    path, bonus = greedy_verify(tree, np.array([99, 12, 13]))
    assert path.tolist() == []
    assert path.dtype == np.int64
    assert bonus == 99


def test_partial_match_stops_at_first_mismatch():
    tree = DraftTree.chain([10, 11, 12, 13])
    path, bonus = greedy_verify(tree, np.array([11, 7, 13, 14]))
    assert path.tolist() == [1]
    assert bonus == 7


def test_longest_branch_wins_and_ties_prefer_smaller_index():
    builder = TreeBuilder(0)
    builder.add_chain(0, [1, 2], True)  # nodes 1, 2
    builder.add_chain(0, [1, 2, 3], True)  # nodes 3, 4, 5
    builder.add_chain(0, [1, 2], True)  # nodes 6, 7
    tree = builder.build()
    argmax = np.array([1, 2, 8, 2, 3, 4, 2, 9])
    path, bonus = greedy_verify(tree, argmax)
    assert path.tolist() == [3, 4, 5]
    assert bonus == 4
    argmax_short = np.array([1, 2, 8, 2, 7, 4, 2, 9])
    path, bonus = greedy_verify(tree, argmax_short)
    assert path.tolist() == [1, 2]  # depth-2 tie between nodes 2, 4, 7
    assert bonus == 8


def test_node_without_logits_is_never_accepted():
    builder = TreeBuilder(0)
    a = builder.add(0, 1, needs_logits=False)
    builder.add(a, 2, needs_logits=True)
    tree = builder.build()
    path, bonus = greedy_verify(tree, np.array([1, -1, 3]))
    assert path.tolist() == []
    assert bonus == 1


def test_argmax_shape_is_checked():
    tree = DraftTree.chain([1, 2])
    with pytest.raises(ValueError):
        greedy_verify(tree, np.array([2]))


@st.composite
def trees_with_argmax(draw):
    vocab = draw(st.integers(1, 4))
    size = draw(st.integers(1, 30))
    builder = TreeBuilder(draw(st.integers(0, vocab - 1)))
    for node in range(1, size):
        builder.add(draw(st.integers(0, node - 1)), draw(st.integers(0, vocab - 1)), draw(st.booleans()))
    tree = builder.build()
    argmax = np.array(
        [draw(st.integers(0, vocab - 1)) if tree.logits[i] else -1 for i in range(size)],
        dtype=np.int64,
    )
    return tree, argmax


def dfs_reference(tree: DraftTree, argmax: np.ndarray) -> tuple[list[int], int]:
    children: dict[int, list[int]] = {}
    for node in range(1, tree.size):
        children.setdefault(int(tree.parents[node]), []).append(node)
    best: list[int] = []
    best_end = 0

    def visit(node: int, path: list[int]) -> None:
        nonlocal best, best_end
        if len(path) > len(best) or (len(path) == len(best) and node < best_end):
            best, best_end = list(path), node
        for child in children.get(node, []):
            if tree.logits[child] and tree.tokens[child] == argmax[node]:
                visit(child, path + [child])

    visit(0, [])
    return best, int(argmax[best_end])


@settings(max_examples=500, deadline=None)
@given(trees_with_argmax())
def test_matches_brute_force_dfs(case):
    tree, argmax = case
    path, bonus = greedy_verify(tree, argmax)
    assert (path.tolist(), bonus) == dfs_reference(tree, argmax)


@st.composite
def chains_with_argmax(draw):
    """Chains below the root (the common step's tree), some nodes without logits."""
    vocab = draw(st.integers(1, 3))
    size = draw(st.integers(1, 20))
    builder = TreeBuilder(draw(st.integers(0, vocab - 1)))
    for node in range(1, size):
        builder.add(node - 1, draw(st.integers(0, vocab - 1)), draw(st.booleans()))
    tree = builder.build()
    argmax = np.array([draw(st.integers(0, vocab - 1)) if tree.logits[i] else -1 for i in range(size)], dtype=np.int64)
    return tree, argmax


@settings(max_examples=300, deadline=None)
@given(chains_with_argmax())
def test_a_chain_matches_brute_force_dfs(case):
    tree, argmax = case
    assert tree.first_branch_node == tree.size
    path, bonus = greedy_verify(tree, argmax)
    assert (path.tolist(), bonus) == dfs_reference(tree, argmax)


@settings(max_examples=300, deadline=None)
@given(trees_with_argmax())
def test_path_is_an_accepted_ancestor_chain(case):
    tree, argmax = case
    path, bonus = greedy_verify(tree, argmax)
    previous = 0
    for depth, node in enumerate(path.tolist(), start=1):
        assert tree.parents[node] == previous
        assert tree.depths[node] == depth
        assert tree.logits[node]
        assert tree.tokens[node] == argmax[previous]
        previous = node
    assert bonus == argmax[previous]
    assert bonus >= 0  # the end node always has logits
