"""One step's draft trees laid out in vLLM's flattened token batch.

vLLM packs every scheduled request's tokens back to back; a request with drafts
occupies ``1 + len(drafts)`` rows: its root (last accepted token) then the
draft tokens in tree node order.  This module turns the per-request
:class:`~vllm_lookahead.core.DraftTree` into what the forward needs:

* RoPE positions ``context_len + depth`` for draft rows (vLLM computed
  ``context_len + row``, which is only right for a chain) -- KV slots stay the
  linear ones vLLM derived from its own positions;
* the attention mask of draft rows: all context KV plus the node's ancestors;
* the rows whose logits are needed (root, verification nodes, last window level)
  and, per request, the row used to sample the root token.

Only torch and numpy here; the runner patches feed it vLLM's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_lookahead.core import DraftTree, StepDraft


@dataclass
class TreeRequest:
    batch_index: int      # request row in vLLM's input batch
    req_id: str
    tree: DraftTree       # the tree as run (already cut to the scheduled prefix)
    draft: StepDraft | None  # the proposer's draft (None: foreign drafts run as a chain)
    token_start: int      # row of the root in the flattened token batch
    context_len: int      # tokens whose KV precede the root (= vLLM num_computed_tokens)
    logit_nodes: np.ndarray  # node ids whose logits are computed, ascending
    mask: torch.Tensor | None = None  # bool (n-1, context_len+n): draft rows' visibility

    @property
    def num_nodes(self) -> int:
        return self.tree.size


@dataclass
class TreeBatch:
    requests: list[TreeRequest]
    logits_indices: torch.Tensor   # rows of hidden states to compute logits for
    sample_rows: torch.Tensor      # (num_reqs,) logits row used to sample each request's next token
    tree_logit_rows: torch.Tensor  # logits rows of all tree nodes with logits, request by request
    slot_mapping: torch.Tensor | None = None  # the step's KV slot per token row

    def logits_rows_as_drafts(self, scheduled_spec: dict[str, list[int]]) -> dict[str, list[int]]:
        """``scheduled_spec_decode_tokens`` as vLLM code that walks logits rows must see it.

        vLLM assumes each request owns ``1 + len(drafts)`` logits rows; a tree request owns
        ``len(logit_nodes)``.  Token values are irrelevant to such code, only lengths.
        """
        view = dict(scheduled_spec)
        for tr in self.requests:
            view[tr.req_id] = [0] * (len(tr.logit_nodes) - 1)
        return view

    def positions_update(self) -> tuple[np.ndarray, np.ndarray]:
        """(token rows, RoPE positions) of every draft row."""
        rows, pos = [], []
        for tr in self.requests:
            n = tr.num_nodes
            rows.append(tr.token_start + np.arange(1, n))
            pos.append(tr.context_len + tr.tree.depths[1:n].astype(np.int64))
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(rows).astype(np.int64), np.concatenate(pos)


def tree_for_scheduled(draft: StepDraft | None, scheduled: list[int]) -> tuple[DraftTree, StepDraft | None]:
    """The tree to run for the draft tokens the scheduler sent.

    The scheduler only ever truncates the proposer's list to a prefix; as trees
    are stored in topological order a prefix is again a tree.  Drafts that do
    not match the pending tree (e.g. stale after preemption) run as a chain,
    which is always a correct, if unhelpful, tree.
    """
    n = len(scheduled)
    if draft is not None and n + 1 <= draft.tree.size:
        tokens = draft.tree.tokens
        if np.array_equal(tokens[1 : n + 1], np.asarray(scheduled, dtype=tokens.dtype)):
            return draft.tree.prefix(n + 1), draft
    root = int(draft.tree.tokens[0]) if draft is not None else -1
    return DraftTree.chain([root, *scheduled]), None


def build_tree_batch(
    req_ids: list[str],
    scheduled_spec: dict[str, list[int]],
    pending: dict[str, StepDraft],
    query_start_loc: np.ndarray,
    num_scheduled: np.ndarray,
    num_computed: np.ndarray,
    device: torch.device,
) -> TreeBatch | None:
    """Lay out this step's trees; None when no request carries drafts."""
    if not scheduled_spec:
        return None
    requests: list[TreeRequest] = []
    logits_rows: list[np.ndarray] = []
    sample_rows = np.zeros(len(req_ids), dtype=np.int64)
    tree_rows: list[np.ndarray] = []
    cursor = 0
    for i, req_id in enumerate(req_ids):
        start = int(query_start_loc[i])
        spec = scheduled_spec.get(req_id)
        if not spec:
            # Plain row (decode without drafts or prefill chunk): logits of its last token.
            logits_rows.append(np.array([start + int(num_scheduled[i]) - 1], dtype=np.int64))
            sample_rows[i] = cursor
            cursor += 1
            continue
        tree, draft = tree_for_scheduled(pending.get(req_id), spec)
        assert tree.size == int(num_scheduled[i]), (tree.size, int(num_scheduled[i]))
        nodes = tree.logit_rows().astype(np.int64)
        tr = TreeRequest(
            batch_index=i,
            req_id=req_id,
            tree=tree,
            draft=draft,
            token_start=start,
            context_len=int(num_computed[i]),
            logit_nodes=nodes,
        )
        requests.append(tr)
        logits_rows.append(start + nodes)
        sample_rows[i] = cursor  # node 0 (root) always has logits and comes first
        tree_rows.append(cursor + np.arange(len(nodes), dtype=np.int64))
        cursor += len(nodes)
    if not requests:
        return None
    for tr in requests:
        tr.mask = draft_rows_mask(tr.tree, tr.context_len).to(device)
    return TreeBatch(
        requests=requests,
        logits_indices=torch.from_numpy(np.concatenate(logits_rows)).to(device),
        sample_rows=torch.from_numpy(sample_rows).to(device),
        tree_logit_rows=torch.from_numpy(np.concatenate(tree_rows)).to(device),
    )


def draft_rows_mask(tree: DraftTree, context_len: int) -> torch.Tensor:
    """Visibility of draft rows 1..n-1: every context position, then their tree ancestors."""
    n = tree.size
    mask = torch.ones((n - 1, context_len + n), dtype=torch.bool)
    mask[:, context_len:] = torch.from_numpy(tree.ancestor_mask()[1:])
    return mask
