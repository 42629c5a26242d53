"""DraftTree / TreeBuilder: topological layout, prefixes, ancestor mask, trie merge."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core import DraftTree, TreeBuilder
from vllm_lookahead.core.tree import chains_tree


@st.composite
def random_trees(draw, max_nodes: int = 40) -> DraftTree:
    size = draw(st.integers(1, max_nodes))
    builder = TreeBuilder(draw(st.integers(0, 9)))
    for node in range(1, size):
        parent = draw(st.integers(0, node - 1))
        builder.add(parent, draw(st.integers(0, 9)), draw(st.booleans()))
    return builder.build()


def brute_force_ancestors(tree: DraftTree, node: int) -> set[int]:
    found = {node}
    while tree.parents[node] >= 0:
        node = int(tree.parents[node])
        found.add(node)
    return found


def test_builder_assigns_ids_depths_and_parents():
    builder = TreeBuilder(42)
    a = builder.add(0, 1, True)
    b = builder.add(a, 2, False)
    c = builder.add(0, 3, True)
    tree = builder.build()
    tree.validate()
    assert (a, b, c) == (1, 2, 3)
    assert tree.tokens.tolist() == [42, 1, 2, 3]
    assert tree.parents.tolist() == [-1, 0, 1, 0]
    assert tree.depths.tolist() == [0, 1, 2, 1]
    assert tree.logits.tolist() == [True, True, False, True]
    assert tree.draft_tokens == [1, 2, 3]
    assert all(type(t) is int for t in tree.draft_tokens)
    assert tree.logit_rows().tolist() == [0, 1, 3]
    assert tree.logit_rows().dtype == np.int64
    assert tree.tokens.dtype == np.int64 and tree.parents.dtype == np.int32


def test_builder_rejects_unknown_parent():
    builder = TreeBuilder(0)
    with pytest.raises(ValueError):
        builder.add(1, 5, True)


def test_chain():
    tree = DraftTree.chain([7, 8, 9])
    tree.validate()
    assert tree.tokens.tolist() == [7, 8, 9]
    assert tree.parents.tolist() == [-1, 0, 1]
    assert tree.depths.tolist() == [0, 1, 2]
    assert tree.logits.all()
    assert tree.size == 3
    assert DraftTree.chain([5]).size == 1


def test_ancestor_mask_hand_example():
    builder = TreeBuilder(0)
    a = builder.add(0, 1, True)
    builder.add(a, 2, True)
    builder.add(0, 3, True)
    mask = builder.build().ancestor_mask()
    expected = np.array(
        [
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 1, 1, 0],
            [1, 0, 0, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(mask, expected)


def test_merge_reuses_children_and_ors_logits():
    builder = TreeBuilder(0)
    first = builder.add_chain(0, [1, 2, 3], needs_logits=False)
    second = builder.add_chain(0, [1, 2, 4], needs_logits=True, merge=True)
    assert second[:2] == first[:2]
    assert second[2] not in first
    tree = builder.build()
    tree.validate()
    assert tree.size == 5
    assert tree.logits.tolist() == [True, True, True, False, True]


def test_no_merge_duplicates_chain():
    builder = TreeBuilder(0)
    builder.add_chain(0, [1, 2], needs_logits=True)
    ids = builder.add_chain(0, [1, 2], needs_logits=True, merge=False)
    assert ids == [3, 4]
    assert builder.build().size == 5


def test_validate_rejects_bad_trees():
    good = DraftTree.chain([1, 2, 3])
    bad_parent = DraftTree(good.tokens, np.array([-1, 0, 2], np.int32), good.depths, good.logits)
    bad_depth = DraftTree(good.tokens, good.parents, np.array([0, 1, 1], np.int32), good.logits)
    bad_root = DraftTree(good.tokens, good.parents, good.depths, np.array([False, True, True]))
    bad_shape = DraftTree(good.tokens[:2], good.parents, good.depths, good.logits)
    for tree in (bad_parent, bad_depth, bad_root, bad_shape):
        with pytest.raises(ValueError):
            tree.validate()


def test_prefix_bounds():
    tree = DraftTree.chain([1, 2, 3])
    with pytest.raises(ValueError):
        tree.prefix(0)
    with pytest.raises(ValueError):
        tree.prefix(4)


@settings(max_examples=200, deadline=None)
@given(random_trees())
def test_random_trees_are_valid_and_mask_is_ancestors(tree: DraftTree):
    tree.validate()
    mask = tree.ancestor_mask()
    for node in range(tree.size):
        assert set(np.flatnonzero(mask[node]).tolist()) == brute_force_ancestors(tree, node)
        # depth == number of strict ancestors
        assert tree.depths[node] == mask[node].sum() - 1


@settings(max_examples=200, deadline=None)
@given(random_trees(), st.data())
def test_every_prefix_is_a_valid_tree(tree: DraftTree, data):
    n = data.draw(st.integers(1, tree.size))
    prefix = tree.prefix(n)
    prefix.validate()
    assert prefix.size == n
    assert prefix.draft_tokens == tree.draft_tokens[: n - 1]
    np.testing.assert_array_equal(prefix.ancestor_mask(), tree.ancestor_mask()[:n, :n])
    assert prefix.logit_rows().tolist() == [r for r in tree.logit_rows().tolist() if r < n]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), max_size=8))
def test_merged_chains_form_a_trie(chains):
    builder = TreeBuilder(0)
    ends = [builder.add_chain(0, chain, needs_logits=True, merge=True)[-1] for chain in chains]
    tree = builder.build()
    tree.validate()
    # Every chain is recoverable from its end node, and no node has two
    # children with the same token.
    for chain, end in zip(chains, ends):
        path = sorted(brute_force_ancestors(tree, end) - {0})
        assert tree.tokens[path].tolist() == chain
    seen = set()
    for node in range(1, tree.size):
        key = (int(tree.parents[node]), int(tree.tokens[node]))
        assert key not in seen
        seen.add(key)
    distinct_prefixes = {tuple(c[:k]) for c in chains for k in range(1, len(c) + 1)}
    assert tree.size - 1 == len(distinct_prefixes)


def test_add_nodes_and_add_chain_build_what_adding_one_by_one_builds():
    one, bulk = TreeBuilder(5), TreeBuilder(5)
    chain = [one.add(0, 6, True, 1)]
    chain.append(one.add(chain[-1], 7, True, 1))
    level = [one.add(p, t, False, 2) for p, t in zip([0, *chain], [6, 8, 9])]
    assert bulk.add_chain(0, [6, 7], True, sources=1) == chain
    assert bulk.add_nodes([0, *chain], [6, 8, 9], False, 2) == level
    assert bulk.add_chain(0, [6, 7, 3], True, merge=True, sources=4) == [*chain, 6]  # merged down the first two
    one.add_chain(0, [6, 7, 3], True, merge=True, sources=4)
    a, b = one.build(), bulk.build()
    for name in ("tokens", "parents", "depths", "logits"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(one.sources, bulk.sources)
    with pytest.raises(ValueError):
        bulk.add_nodes([99], [1], True)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_block_builds_what_adding_its_nodes_one_by_one_builds(data):
    """add_block then merged chains: the same tree as add calls, merges reaching into the block."""
    one, bulk = TreeBuilder(5), TreeBuilder(5)
    for chain in data.draw(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), max_size=3)):
        one.add_chain(0, chain, True, merge=True)
        bulk.add_chain(0, chain, True, merge=True)
    start = one.size
    tokens, parents, depths, logits = [], [], [], []
    for k in range(data.draw(st.integers(0, 8))):
        parent = data.draw(st.integers(0, start + k - 1))
        tokens.append(data.draw(st.integers(0, 3)))
        parents.append(parent)
        depths.append((one.depth(parent) if parent < start else depths[parent - start]) + 1)
        logits.append(data.draw(st.booleans()))
    for token, parent, needs in zip(tokens, parents, logits):
        one.add(parent, token, needs, 2)
    bulk.add_block(tokens, parents, depths, logits, 2)
    for chain in data.draw(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), max_size=3)):
        ids = one.add_chain(0, chain, True, merge=True, sources=3)
        assert bulk.add_chain(0, chain, True, merge=True, sources=3) == ids
    a, b = one.build(), bulk.build()
    for name in ("tokens", "parents", "depths", "logits"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(one.sources, bulk.sources)
    with pytest.raises(ValueError):
        bulk.add_block([1], [0, 0], [1], [True])


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 9),
    st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.integers(0, 5)), max_size=8),
    st.lists(st.integers(0, 5), min_size=6, max_size=6),
    st.booleans(),
    st.integers(0, 30),
)
def test_chains_in_one_call_build_what_adding_them_one_by_one_builds(root, chains, lead_sources, merge, room):
    """chains_tree (RequestLookahead.build's tree, one compiled call) == add_chain of each chain in
    turn, every chain after the first only while the draft nodes fit the room: a lead with a
    source per token, then candidates with one source each (merged into a trie or not)."""
    sources = [lead_sources[: len(c)] if k == 0 else [s] * len(c) for k, (c, s) in enumerate(chains)]
    builder, used = TreeBuilder(root), 0
    for k, ((chain, _), chain_sources) in enumerate(zip(chains, sources)):
        if k and builder.size - 1 + len(chain) > room:
            break
        builder.add_chain(0, chain, needs_logits=True, merge=merge, sources=chain_sources)
        used += 1
    want = builder.build()
    arrays, size, got_used = chains_tree(root, [c for c, _ in chains], sources, merge, room, spare=3)
    assert got_used == used and len(arrays[0]) == 1 + sum(len(c) for c, _ in chains) + 3  # room for 3 more
    tokens, parents, depths, logits, got_sources = (array[:size] for array in arrays)
    for name, got in zip(("tokens", "parents", "depths", "logits"), (tokens, parents, depths, logits)):
        np.testing.assert_array_equal(got, getattr(want, name))
        assert got.dtype == getattr(want, name).dtype
    np.testing.assert_array_equal(got_sources, builder.sources)
    assert got_sources.dtype == np.int8
