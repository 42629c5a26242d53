"""``verify_step.row_argmax``: the same index as vLLM's greedy sampler (``logits.to(float32).argmax``)
for every row -- ties, infinities and NaNs included -- whichever path (numpy or torch) it takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("vllm")
from vllm_lookahead.engine.step.verification import row_argmax  # noqa: E402

SPECIAL = st.sampled_from([0.0, 1.0, -1.0, 3.5, float("inf"), float("-inf"), float("nan")])


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 6), vocab=st.integers(1, 40), data=st.data())
def test_same_index_as_torch_argmax(rows: int, vocab: int, data: st.DataObject) -> None:
    # few distinct values, so ties are frequent; specials placed anywhere
    values = data.draw(
        st.lists(st.one_of(st.sampled_from([0.0, 1.0, 2.0]), SPECIAL), min_size=rows * vocab, max_size=rows * vocab)
    )
    logits = torch.tensor(values, dtype=torch.float32).reshape(rows, vocab)
    expect = logits.argmax(dim=-1).numpy()
    np.testing.assert_array_equal(row_argmax(logits), expect)
    # a 16-bit tensor goes through float32 first, as vLLM's sampler converts it
    half = logits.to(torch.bfloat16)
    np.testing.assert_array_equal(row_argmax(half), half.to(torch.float32).argmax(dim=-1).numpy())


def test_row_views_and_strided_tensors() -> None:
    logits = torch.randn(8, 1000)
    logits[:, 7] = 100.0
    view = logits[2:6]  # the tree rows of a roots-first batch are such a view
    assert row_argmax(view).tolist() == [7, 7, 7, 7]
    assert row_argmax(logits.t().contiguous().t()).tolist() == logits.argmax(dim=-1).tolist()


def test_node_argmax_reads_the_tree_rows_of_either_layout() -> None:
    from types import SimpleNamespace

    from vllm_lookahead.engine.step.verification import _node_argmax

    logits = torch.randn(9, 50)
    # roots first: 4 requests, trees at batch indices 1 and 3 (their roots rows 1 and 3), tree rows 4-8
    rows = np.array([1, 4, 5, 3, 6, 7, 8])
    got = _node_argmax(logits, SimpleNamespace(tree_logit_rows=rows, roots_first=True), num_reqs=4)
    assert got.tolist() == logits.argmax(dim=-1)[torch.from_numpy(rows)].tolist()
    rows = np.array([2, 3, 4, 7, 8])  # request by request
    got = _node_argmax(logits, SimpleNamespace(tree_logit_rows=rows, roots_first=False), num_reqs=4)
    assert got.tolist() == logits.argmax(dim=-1)[torch.from_numpy(rows)].tolist()
