import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from support.drafting import draft_one
from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import DraftTree, RequestLookahead
from vllm_lookahead.engine.step.tree_batch import build_tree_batch, draft_rows_mask, tree_for_scheduled


def _draft(seed=0):
    params = LookaheadConfig(window_size=3, ngram_size=3, guess_set_size=2)
    state = RequestLookahead(params, [5, 6, 7, 5, 6, 8, 5, 6, 9], seed=seed)
    return draft_one(state, 5)


def test_scheduled_prefix_keeps_tree_and_mismatch_runs_as_chain():
    draft = _draft()
    tokens = draft.tree.draft_tokens
    tree, kept = tree_for_scheduled(draft, tokens[:3])
    assert kept is draft and tree.size == 4
    assert np.array_equal(tree.parents, draft.tree.parents[:4])
    tree, kept = tree_for_scheduled(draft, [1, 2, 3])
    assert kept is None and list(tree.depths) == [0, 1, 2, 3]


def test_mask_sees_context_and_ancestors_only():
    tree = DraftTree.chain([1, 2, 3])
    m = draft_rows_mask(tree, 4)
    assert m.shape == (2, 7)
    assert m[:, :4].all()
    assert m[0, 4:].tolist() == [True, True, False]
    assert m[1, 4:].tolist() == [True, True, True]


def test_batch_layout_mixed_with_plain_rows():
    draft = _draft()
    spec = draft.tree.draft_tokens
    n = 1 + len(spec)
    # request a: prefill chunk of 10 rows; b: tree; c: plain decode
    qsl = np.array([0, 10, 10 + n, 11 + n])
    batch = build_tree_batch(
        ["a", "b", "c"], {"b": spec}, {"b": draft}.get, qsl, np.diff(qsl), np.array([0, 20, 30]), torch.device("cpu")
    )
    (tr,) = batch.requests
    assert tr.token_start == 10 and tr.context_len == 20 and tr.num_nodes == n
    logit_nodes = draft.tree.logit_rows()
    expected = [9, *(10 + logit_nodes).tolist(), 10 + n]
    assert batch.logits_indices.tolist() == expected
    assert batch.sample_rows.tolist() == [0, 1, 1 + len(logit_nodes)]
    positions = _vllm_positions(qsl, [0, 20, 30])
    batch.write_positions(positions)
    assert positions[:10].tolist() == list(range(10)) and positions[10 + n] == 30
    assert positions[10 : 10 + n].tolist() == (20 + draft.tree.depths).tolist()


def _vllm_positions(query_start_loc, computed) -> torch.Tensor:
    """The positions vLLM computes for a step's rows: a request's row ``k`` at ``computed + k``."""
    return torch.from_numpy(
        np.concatenate([c + np.arange(b - a) for a, b, c in zip(query_start_loc[:-1], query_start_loc[1:], computed)])
    )


def test_logits_rows_as_drafts_matches_logits_layout():
    draft = _draft()
    spec = draft.tree.draft_tokens
    n = 1 + len(spec)
    qsl = np.array([0, 1, 1 + n])
    batch = build_tree_batch(
        ["a", "b"], {"b": spec}, {"b": draft}.get, qsl, np.diff(qsl), np.array([5, 20]), torch.device("cpu")
    )
    view = batch.logits_rows_as_drafts({"b": spec})
    # vLLM's row walk (1 + len(drafts) rows per request) must land on our layout
    rows = sum(1 + len(view.get(r, ())) for r in ("a", "b"))
    assert rows == len(batch.logits_indices)
    assert view.get("a") is None and len(view["b"]) == len(draft.tree.logit_rows()) - 1


def test_roots_first_layout_puts_every_root_row_first():
    """Roots first: the sampler's rows are the logits' first ``num_reqs`` rows (a slice, no copy);
    each tree's rows are its root's, then its other nodes' after every root."""
    draft = _draft()
    spec = draft.tree.draft_tokens
    n = 1 + len(spec)
    qsl = np.array([0, 10, 10 + n, 11 + n])
    batch = build_tree_batch(
        ["a", "b", "c"],
        {"b": spec},
        {"b": draft}.get,
        qsl,
        np.diff(qsl),
        np.array([0, 20, 30]),
        torch.device("cpu"),
        roots_first=True,
    )
    logit_nodes = draft.tree.logit_rows()
    assert batch.roots_first
    assert batch.logits_indices.tolist() == [9, 10, 10 + n, *(10 + logit_nodes[1:]).tolist()]
    assert batch.sample_rows is None  # the roots are the logits' first rows, in batch order
    assert batch.tree_logit_rows.tolist() == [1, *range(3, 3 + len(logit_nodes) - 1)]
    # each tree node's logits row reads the hidden state of that node's token row
    rows = batch.logits_indices[batch.tree_logit_rows].tolist()
    assert rows == (10 + logit_nodes).tolist()
    with pytest.raises(RuntimeError, match="grammar bitmask"):
        batch.logits_rows_as_drafts({"b": spec})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(1, 6), st.integers(0, 40)), min_size=1, max_size=9),
    st.booleans(),
)
def test_every_layout_reads_each_requests_rows(requests, roots_first):
    """Any mix of plain rows (decodes, prefill chunks) and trees (cut to a prefix of any length):
    each request's sampled row reads its root (a plain request's last token), each tree's logits
    rows read its logit nodes' token rows in node order, and the draft rows get ``context + depth``."""
    draft = _draft()
    req_ids, spec, drafts, sizes, computed = [], {}, {}, [], []
    for i, (tree, count, context) in enumerate(requests):
        req_id = f"r{i}"
        req_ids.append(req_id)
        computed.append(context)
        if tree:
            cut = min(count, draft.tree.size - 1)
            spec[req_id], drafts[req_id] = draft.tree.draft_tokens[:cut], draft
            sizes.append(cut + 1)
        else:
            sizes.append(count)
    qsl = np.concatenate([[0], np.cumsum(sizes)])
    batch = build_tree_batch(
        req_ids, spec, drafts.get, qsl, np.diff(qsl), np.array(computed), torch.device("cpu"), roots_first
    )
    if not spec:
        assert batch is None
        return
    logits = batch.logits_indices.tolist()
    # roots first: the logits' first rows are the roots, in batch order (no gather to sample them)
    assert (batch.sample_rows is None) == roots_first
    sample_rows = list(range(len(req_ids))) if roots_first else batch.sample_rows.tolist()
    trees = iter(batch.requests)
    tree_rows, rows, positions = [], [], []
    for i, req_id in enumerate(req_ids):
        if req_id in spec:
            tr = next(trees)
            nodes = tr.tree.logit_rows()
            assert tr.batch_index == i and tr.token_start == qsl[i] and tr.num_nodes == sizes[i]
            assert logits[sample_rows[i]] == qsl[i]
            tree_rows.append((qsl[i] + nodes).tolist())
            rows += list(range(qsl[i] + 1, qsl[i] + sizes[i]))
            positions += (computed[i] + tr.tree.depths[1:]).tolist()
        else:
            assert logits[sample_rows[i]] == qsl[i + 1] - 1
    assert [logits[r] for r in batch.tree_logit_rows.tolist()] == [r for t in tree_rows for r in t]
    assert len(logits) == len(req_ids) + sum(len(t) - 1 for t in tree_rows)
    if not roots_first:  # request by request: a request's rows follow the one before
        assert sample_rows == sorted(set(sample_rows))
    vllm_positions = _vllm_positions(qsl, computed)
    written = vllm_positions.clone()
    batch.write_positions(written)
    assert written[rows].tolist() == positions
    untouched = np.ones(len(written), dtype=bool)
    untouched[rows] = False
    assert torch.equal(written[untouched], vllm_positions[untouched])
    assert set(batch.branch_positions()[0].tolist()) <= set(rows)  # a chain's rows stay vLLM's
