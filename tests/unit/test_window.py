"""JacobiWindow: initialisation, tree layout, warm-up, n-gram extraction, shifting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core import DraftTree, JacobiWindow, TreeBuilder

SHAPES = [(1, 2), (1, 4), (3, 2), (4, 3), (5, 5), (7, 5), (2, 6)]


def make_window(width, ngram, prompt=(11, 12, 13, 14), seed=0, shift="one") -> JacobiWindow:
    return JacobiWindow(width, ngram, list(prompt), np.random.default_rng(seed), shift=shift)


def fill(window: JacobiWindow, base: int = 100) -> None:
    """Warm the window up with distinct, recognisable tokens."""
    while not window.full:
        window.update(base + window.filled * 10 + np.arange(window.window_size), 0, [])


def node_text(tree: DraftTree, node: int) -> list[int]:
    text = []
    while node >= 0:
        text.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    return text[::-1]


def test_init_samples_level_zero_from_prompt():
    prompt = [11, 12, 13]
    window = make_window(6, 4, prompt)
    assert window.filled == 1 and not window.full
    assert len(window.levels) == 1
    level0 = window.levels[0]
    assert level0.dtype == np.int64 and level0.shape == (6,)
    assert level0[0] == 0
    assert set(level0[1:].tolist()) <= set(prompt)


def test_init_is_seeded_and_empty_prompt_gives_zeros():
    a = make_window(8, 3, range(50), seed=3).levels[0]
    b = make_window(8, 3, range(50), seed=3).levels[0]
    np.testing.assert_array_equal(a, b)
    assert make_window(4, 3, [], seed=1).levels[0].tolist() == [0, 0, 0, 0]


def test_ngram_size_two_is_full_from_start_and_width_one():
    assert make_window(3, 2).full
    window = make_window(1, 3)
    assert window.levels[0].tolist() == [0]
    assert not window.full


@pytest.mark.parametrize("width,ngram", SHAPES)
def test_warm_up_takes_n_minus_2_updates(width, ngram):
    window = make_window(width, ngram)
    for step in range(ngram - 2):
        assert not window.full
        assert window.update(np.arange(width), 0, []).shape == (0, ngram)
        assert window.filled == step + 2
    assert window.full and window.filled == ngram - 1
    assert len(window.update(np.arange(width), 0, [])) == width
    assert window.filled == ngram - 1


@pytest.mark.parametrize("width,ngram", SHAPES)
@pytest.mark.parametrize("offset", [0, 3])
def test_tree_layout_at_every_fill_level(width, ngram, offset):
    window = make_window(width, ngram)
    while True:
        builder = TreeBuilder(7)
        builder.add_chain(0, [1] * offset, True)  # a verification branch first
        outputs = window.add_to_tree(builder, root=0)
        tree = builder.build()
        tree.validate()
        filled = window.filled
        assert tree.size == 1 + offset + width * filled - 1

        def node(j: int, i: int) -> int:
            return 0 if j == i == 0 else offset + j * width + i

        for j in range(filled):
            for i in range(width):
                k = node(j, i)
                assert tree.depths[k] == i + j
                expected_parent = -1 if k == 0 else node(j - 1, i) if j else node(0, i - 1)
                assert tree.parents[k] == expected_parent
                assert tree.logits[k] == (k == 0 or j == filled - 1)
                if k:
                    assert tree.tokens[k] == window.levels[j][i]
        assert outputs.tolist() == [node(filled - 1, i) for i in range(width)]
        if window.full:
            break
        window.update(np.arange(width) + 50, 0, [])


def test_ngrams_from_a_full_window_hand_example():
    window = make_window(3, 4)
    window.levels = [np.array([0, 21, 22]), np.array([30, 31, 32]), np.array([40, 41, 42])]
    builder = TreeBuilder(9)
    window.add_to_tree(builder)
    ngrams = window.update(np.array([50, -1, 52]), 0, [])
    assert ngrams.tolist() == [[9, 30, 40, 50], [22, 32, 42, 52]]  # column 1 unknown
    # shift "one": drop level 0, append outputs (-1 replaced by old last level)
    assert [lv.tolist() for lv in window.levels] == [[30, 31, 32], [40, 41, 42], [50, 41, 52]]


def test_minus_one_during_warm_up_uses_old_last_level():
    window = make_window(4, 4, prompt=[5])
    assert window.levels[0].tolist() == [0, 5, 5, 5]
    window.update(np.array([7, -1, 8, -1]), 0, [])
    assert window.levels[1].tolist() == [7, 5, 8, 5]
    assert all((lv >= 0).all() for lv in window.levels)


def test_ngram_size_two_ngrams_and_shift():
    window = make_window(3, 2, prompt=[4])
    window.add_to_tree(TreeBuilder(1))
    assert window.update(np.array([2, 5, -1]), 0, []).tolist() == [[1, 2], [4, 5]]
    assert window.levels[0].tolist() == [2, 5, 4]


@pytest.mark.parametrize("num_accepted", [0, 1, 2, 3])
def test_shift_accepted(num_accepted):
    width, ngram = 5, 4
    one = make_window(width, ngram, shift="one", seed=1)
    accepted = make_window(width, ngram, shift="accepted", seed=1)
    fill(one)
    fill(accepted)
    old = [lv.copy() for lv in accepted.levels]
    outputs = np.array([60, 61, -1, 63, 64])
    fill_tokens = [901, 902]
    ngrams_one = one.update(outputs, num_accepted, fill_tokens)
    ngrams_acc = accepted.update(outputs, num_accepted, fill_tokens)
    np.testing.assert_array_equal(ngrams_one, ngrams_acc)  # n-grams are read before the slide
    expected_one = old[1:] + [np.where(outputs >= 0, outputs, old[-1])]
    assert [lv.tolist() for lv in one.levels] == [lv.tolist() for lv in expected_one]
    k = num_accepted
    for new, reference in zip(accepted.levels, expected_one):
        assert new.tolist()[: width - k] == reference.tolist()[k:]
        assert set(new.tolist()[width - k :]) <= set(fill_tokens)
    if k == 0:
        assert [lv.tolist() for lv in accepted.levels] == [lv.tolist() for lv in one.levels]


def test_shift_accepted_with_empty_fill_and_large_k():
    window = make_window(3, 2, shift="accepted")
    window.update(np.array([1, 2, 3]), 1, [])
    assert window.levels[0].tolist() == [2, 3, 0]
    window.update(np.array([4, 5, 6]), 9, [7])
    assert window.levels[0].tolist() == [7, 7, 7]


def test_reset_returns_to_single_level():
    window = make_window(4, 4)
    fill(window)
    window.reset([3])
    assert window.filled == 1
    assert window.levels[0].tolist() == [0, 3, 3, 3]


def markov_oracle(context_size: int, vocab: int):
    def oracle(text: list[int]) -> int:
        return hash(tuple(text[-context_size:])) % vocab

    return oracle


@settings(max_examples=100, deadline=None)
@given(
    width=st.integers(1, 6),
    ngram=st.integers(2, 6),
    seed=st.integers(0, 2**16),
    shift=st.sampled_from(["one", "accepted"]),
    steps=st.integers(1, 8),
    data=st.data(),
)
def test_window_ngrams_are_facts_of_an_order_n_minus_1_model(width, ngram, seed, shift, steps, data):
    """Each column + its argmax is the continuation the model itself produced.

    With a model that looks at the last N - 1 tokens, every n-gram the window
    returns must satisfy ``model(ngram[:-1]) == ngram[-1]``.
    """
    vocab = 7
    oracle = markov_oracle(ngram - 1, vocab)
    rng = np.random.default_rng(seed)
    window = JacobiWindow(width, ngram, list(range(vocab)), rng, shift=shift)
    root = 3
    for _ in range(steps):
        builder = TreeBuilder(root)
        outputs_nodes = window.add_to_tree(builder)
        tree = builder.build()
        run = data.draw(st.integers(1, tree.size))
        outputs = np.array([oracle([5, 5] + node_text(tree, k)) if k < run else -1 for k in outputs_nodes])
        was_full = window.full
        ngrams = window.update(outputs, data.draw(st.integers(0, ngram - 1)), [1, 2])
        assert len(ngrams) == (int((outputs >= 0).sum()) if was_full else 0)
        for gram in ngrams:
            assert len(gram) == ngram
            assert oracle(list(gram[:-1])) == gram[-1]
        assert window.filled <= ngram - 1
        assert all(lv.shape == (width,) and (lv >= 0).all() for lv in window.levels)
        root = int(outputs[0])


@pytest.mark.parametrize(("width", "ngram"), SHAPES)
def test_the_root_column_is_the_first_column_added_at_the_first_level(width, ngram):
    """A window at its first level drafting its first column alone adds no node: its root
    column is what adding that column to a tree gives, root token included; past the first
    level the column has nodes and the shortcut refuses."""
    window, other = make_window(width, ngram), make_window(width, ngram)
    builder = TreeBuilder(42)
    assert window.root_column(42).tolist() == other.add_to_tree(builder, 0, 1).tolist()
    assert builder.size == 1 and window.root_token == other.root_token == 42
    window.update(np.arange(width) + 50, 0, [])
    if not window.full:
        with pytest.raises(ValueError):
            window.root_column(42)
