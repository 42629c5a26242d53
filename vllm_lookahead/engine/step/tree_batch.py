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
  and, per request, the row used to sample the root token.  Unless a step serves structured
  output, every request's root row comes first, in batch order, and the trees' other rows after
  them (``roots_first``): the sampler then reads the roots as one slice of the logits instead of
  a gathered copy (at 32 requests in flight a 32 x vocabulary copy per step).  vLLM's grammar
  bitmask walks logits rows request by request (``1 + drafts`` each), so steps with structured
  output keep each request's rows together.

Only torch and numpy here (the logits rows in one compiled loop, :mod:`.layout_loop`);
:class:`~vllm_lookahead.engine.runner.RunnerLookahead`
feeds it vLLM's arrays and owns the batch for the step (the attention wrapper and
the grammar hook read it through :mod:`~vllm_lookahead.engine.hooks.step_context`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from vllm_lookahead.core import DraftTree, StepDraft
from vllm_lookahead.engine.step.kv import PagedKV
from vllm_lookahead.engine.step.layout_loop import load as layout_loops


@dataclass
class TreeRequest:
    batch_index: int  # request row in vLLM's input batch
    req_id: str
    tree: DraftTree  # the tree as run (already cut to the scheduled prefix)
    draft: StepDraft | None  # the proposer's draft (None: foreign drafts run as a chain)
    token_start: int  # row of the root in the flattened token batch
    context_len: int  # tokens whose KV precede the root (= vLLM num_computed_tokens)
    logit_nodes: np.ndarray  # node ids whose logits are computed, ascending

    @property
    def num_nodes(self) -> int:
        return self.tree.size

    @property
    def first_branch_node(self) -> int:
        """First node whose ancestors are not all earlier nodes (``num_nodes`` for a chain).

        Nodes before it form a chain below the root, for which vLLM's causal
        attention is already the tree attention: only later rows are recomputed.
        """
        return self.tree.first_branch_node


@dataclass
class TreeBatch:
    requests: list[TreeRequest]
    logits_indices: torch.Tensor  # rows of hidden states to compute logits for
    sample_rows: torch.Tensor | None  # (num_reqs,) logits row sampled per request (None: roots_first)
    tree_logit_rows: np.ndarray  # logits rows of all tree nodes with logits, request by request (host)
    slot_mapping: torch.Tensor | None = None  # the step's KV slot per token row (:meth:`slots`)
    block_table: torch.Tensor | None = None  # (num_reqs, max_blocks) the step's block table (:meth:`table`)
    kv: PagedKV | None = None  # the worker's paged KV cache
    kv_rows: tuple | None = None  # (vLLM's BlockTable, tokens, requests) of the step: the two above, read on first use
    tree_attention_layers: int = 0  # layers whose draft rows got the tree mask this step
    kernel_metadata: tuple | None = None  # (vLLM's attention metadata, ours with the tree rows cut), CPU_ATTN
    roots_first: bool = False  # logits rows 0..num_reqs-1 are the roots (no sample_rows: a slice of the logits)

    kernel_plans: dict = field(default_factory=dict)  # the Triton kernel's launch plan per layer geometry

    def slots(self) -> torch.Tensor:
        """The step's KV slot per token row: :attr:`slot_mapping`, taken from :attr:`kv_rows` the
        first time a step reads it -- one that accepts along its trees' chains never does (a torch
        call per step saved where the batch's trees are chains).  A view of vLLM's buffer, which
        holds the step's slots from ``_prepare_inputs`` until the next step's."""
        if self.slot_mapping is None and self.kv_rows is not None:
            table, num_tokens, _ = self.kv_rows
            self.slot_mapping = table.slot_mapping.gpu[:num_tokens]
        assert self.slot_mapping is not None, "tree batch without KV access"
        return self.slot_mapping

    def table(self) -> torch.Tensor:
        """``(num_reqs, max_blocks)`` the step's block table: :attr:`block_table`, taken from
        :attr:`kv_rows` the first time a step reads it (its branching trees' attention)."""
        if self.block_table is None and self.kv_rows is not None:
            table, _, num_reqs = self.kv_rows
            self.block_table = table.get_device_tensor(num_reqs)
        assert self.block_table is not None, "tree batch without KV access"
        return self.block_table

    @cached_property
    def branching(self) -> list[TreeRequest]:
        """The requests whose trees branch: their rows after the leading chain need the tree mask."""
        return [tr for tr in self.requests if tr.first_branch_node < tr.num_nodes]

    @cached_property
    def needs_tree_attention(self) -> bool:
        """Whether any draft row needs the tree mask (False when every tree is a chain)."""
        return bool(self.branching)

    @cached_property
    def draft_rows(self) -> PaddedDraftRows | None:
        """The draft rows that need the tree mask, as one padded attention problem (the torch
        pass's layout; the Triton kernel reads :attr:`branching` and the paged cache in place).

        Built on first use (the first attention layer of the step); None when no row needs it.
        """
        assert self.kv is not None, "tree batch without KV access"
        return PaddedDraftRows.build(self.requests, self.table(), self.kv.block_size)

    def logits_rows_as_drafts(self, scheduled_spec: dict[str, list[int]]) -> dict[str, list[int]]:
        """``scheduled_spec_decode_tokens`` as vLLM code that walks logits rows must see it.

        vLLM assumes each request owns ``1 + len(drafts)`` logits rows; a tree request owns
        ``len(logit_nodes)``.  Token values are irrelevant to such code, only lengths.
        """
        if self.roots_first:
            raise RuntimeError(
                "vllm-lookahead: a step laid out roots first cannot take a grammar bitmask "
                "(the runner lays out steps with structured output request by request)"
            )
        view = dict(scheduled_spec)
        for tr in self.requests:
            view[tr.req_id] = [0] * (len(tr.logit_nodes) - 1)
        return view

    def branch_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """(token rows, RoPE positions) of the draft rows whose position is not vLLM's: each
        branching tree's rows from its first branch on.  vLLM gives a request's row ``k`` the
        position ``context_len + k``, which is node ``k``'s ``context_len + depth`` up to there
        (and for every row of a chain)."""
        rows, positions = [], []
        for tr in self.branching:
            first = tr.first_branch_node
            rows.append(np.arange(tr.token_start + first, tr.token_start + tr.num_nodes, dtype=np.int64))
            positions.append(tr.tree.depths[first:].astype(np.int64) + tr.context_len)
        if not rows:
            return _NO_ROWS, _NO_ROWS
        return np.concatenate(rows), np.concatenate(positions)

    def write_positions(self, positions: torch.Tensor) -> None:
        """Give the draft rows their tree positions in vLLM's ``positions`` (which it computed for
        linear drafts this step): the rows of :meth:`branch_positions` only, written in place on a
        CPU, with one host-to-device copy elsewhere."""
        rows, values = self.branch_positions()
        if not len(rows):
            return
        if positions.device.type == "cpu":
            positions.numpy()[rows] = values
            return
        both = torch.from_numpy(np.concatenate([rows, values])).to(positions.device)
        positions[both[: len(rows)]] = both[len(rows) :].to(positions.dtype)


_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.setflags(write=False)


def tree_for_scheduled(draft: StepDraft | None, scheduled: list[int]) -> tuple[DraftTree, StepDraft | None]:
    """The tree to run for the draft tokens the scheduler sent.

    The scheduler only ever truncates the proposer's list to a prefix; as trees
    are stored in topological order a prefix is again a tree.  Drafts that do
    not match the pending tree (e.g. stale after preemption) run as a chain,
    which is always a correct, if unhelpful, tree.
    """
    n = len(scheduled)
    if draft is not None and n + 1 <= draft.tree.size and draft.tree.token_list[1 : n + 1] == list(scheduled):
        return draft.tree.prefix(n + 1), draft
    root = int(draft.tree.tokens[0]) if draft is not None else -1
    return DraftTree.chain([root, *scheduled]), None


def build_tree_batch(
    req_ids: list[str],
    scheduled_spec: dict[str, list[int]],
    draft_of: Callable[[str], StepDraft | None],
    query_start_loc: np.ndarray,
    num_scheduled: np.ndarray,
    num_computed: np.ndarray,
    device: torch.device,
    roots_first: bool = False,
) -> TreeBatch | None:
    """Lay out this step's trees; None when no request carries drafts.  ``roots_first``: every
    request's root (or last) row first, in batch order, then each tree's other rows (the module
    docstring); else each request's rows together, as vLLM lays out linear drafts."""
    if not scheduled_spec:
        return None
    n = len(req_ids)
    spec_at = [i for i, req_id in enumerate(req_ids) if scheduled_spec.get(req_id)]
    if not spec_at:
        return None
    requests = [
        _tree_request(
            i,
            req_ids[i],
            draft_of(req_ids[i]),
            scheduled_spec[req_ids[i]],
            int(query_start_loc[i]),
            num_scheduled,
            num_computed,
        )
        for i in spec_at
    ]
    logits_rows, sample_rows, tree_rows = layout_loops().logits_layout(
        query_start_loc,
        num_scheduled[:n],
        np.array(spec_at, dtype=np.int64),
        np.array([len(tr.logit_nodes) for tr in requests], dtype=np.int64),
        np.concatenate([tr.logit_nodes for tr in requests]),
        roots_first,
    )
    return TreeBatch(
        requests=requests,
        logits_indices=torch.from_numpy(logits_rows).to(device),
        sample_rows=None if roots_first else torch.from_numpy(sample_rows).to(device),
        tree_logit_rows=tree_rows,
        roots_first=roots_first,
    )


def _tree_request(
    i: int,
    req_id: str,
    pending: StepDraft | None,
    spec: list[int],
    start: int,
    num_scheduled: np.ndarray,
    num_computed: np.ndarray,
) -> TreeRequest:
    """Request ``i``'s tree as the scheduler sent it (``spec``), placed at token row ``start``."""
    tree, draft = tree_for_scheduled(pending, spec)
    assert tree.size == int(num_scheduled[i]), (tree.size, int(num_scheduled[i]))
    return TreeRequest(
        batch_index=i,
        req_id=req_id,
        tree=tree,
        draft=draft,
        token_start=start,
        context_len=int(num_computed[i]),
        logit_nodes=tree.logit_rows(),  # node 0 (root) always has logits and comes first
    )


def draft_rows_mask(tree: DraftTree, context_len: int) -> torch.Tensor:
    """Visibility of draft rows 1..n-1: every context position, then their tree ancestors."""
    n = tree.size
    mask = torch.ones((n - 1, context_len + n), dtype=torch.bool)
    mask[:, context_len:] = torch.from_numpy(tree.ancestor_mask()[1:])
    return mask


@dataclass
class PaddedDraftRows:
    """The draft rows of ``R`` tree requests as one batched, padded attention problem.

    Request ``r`` has ``q_r`` draft rows to recompute (those from its first branch
    on, see :attr:`TreeRequest.first_branch_node`) and ``L_r = context_len + n_r``
    keys spread over its KV blocks.  Everything is padded to ``Q = max q_r`` rows
    and ``NB = max blocks`` blocks, so each attention layer needs one gather each of
    queries, keys and values, two matmuls and a softmax, and one scatter -- however
    many requests carry trees (:mod:`vllm_lookahead.engine.step.attention`).  Padded keys are
    masked out; padded query rows see key 0 only (never all-masked, which would give
    NaN) and are dropped.  The row indices the layers share are built once per step
    (:attr:`plans`, filled by the first layer).
    """

    block_size: int
    blocks: torch.Tensor  # (R, NB) long: each request's KV blocks, in order
    query_rows: torch.Tensor  # (R*Q,) long: flattened-batch row of each padded query row
    valid: torch.Tensor  # (number of draft rows,) long: which of the R*Q padded rows are real
    out_rows: torch.Tensor  # (number of draft rows,) long: their rows in the flattened batch
    num_requests: int
    max_queries: int
    num_blocks: int
    requests: list  # the TreeRequests with rows here, in order
    plans: dict = field(default_factory=dict)  # per layer geometry: the gather/scatter plan of this step

    @cached_property
    def mask(self) -> torch.Tensor:
        """``(R, 1, Q, NB*block_size)`` bool: the keys each padded row sees (its context and its
        ancestors; a padding row key 0).  Built on first use: the torch pass reads it, the Triton
        kernel reads the trees' ancestor bits instead (a dense mask over a long context is host
        work a GPU step would not use)."""
        R, Q = self.num_requests, self.max_queries
        mask = torch.zeros((R, 1, Q, self.num_blocks * self.block_size), dtype=torch.bool)
        for r, tr in enumerate(self.requests):
            first = tr.first_branch_node
            q = tr.num_nodes - first
            mask[r, 0, :q, : tr.context_len + tr.num_nodes] = draft_rows_mask(tr.tree, tr.context_len)[first - 1 :]
            mask[r, 0, q:, 0] = True
        return mask.to(self.blocks.device)

    @property
    def padded(self) -> bool:
        """Whether some request has fewer rows than ``Q`` (their padding rows are dropped)."""
        return self.valid.numel() != self.num_requests * self.max_queries

    def additive_mask(self, group: int, dtype: torch.dtype) -> torch.Tensor:
        """The mask as 0 / -inf, ``(R, 1, group*Q, keys)``: each query row repeated for the
        ``group`` query heads that share a KV head (stacked head-major, as the pass stacks them)."""
        R, _, Q, keys = self.mask.shape
        rows = self.mask.view(R, 1, 1, Q, keys).expand(R, 1, group, Q, keys).reshape(R, 1, group * Q, keys)
        return torch.zeros(rows.shape, dtype=dtype, device=rows.device).masked_fill_(~rows, float("-inf"))

    @classmethod
    def build(cls, requests: list[TreeRequest], block_table: torch.Tensor, block_size: int) -> PaddedDraftRows | None:
        """None when every tree is a chain (vLLM's causal attention is then exact)."""
        requests = [tr for tr in requests if tr.first_branch_node < tr.num_nodes]
        if not requests:
            return None
        R = len(requests)
        Q = max(tr.num_nodes - tr.first_branch_node for tr in requests)
        lengths = [tr.context_len + tr.num_nodes for tr in requests]
        NB = max(-(-L // block_size) for L in lengths)
        table = block_table.index_select(
            0, torch.tensor([tr.batch_index for tr in requests], device=block_table.device)
        )
        if table.shape[1] < NB:  # cannot happen for a valid table; pad defensively with block 0
            table = torch.nn.functional.pad(table, (0, NB - table.shape[1]))
        blocks = table[:, :NB].to(torch.long)
        query_rows = np.empty((R, Q), dtype=np.int64)
        valid, out_rows = [], []
        for r, tr in enumerate(requests):
            first = tr.first_branch_node
            q = tr.num_nodes - first
            query_rows[r, :] = tr.token_start  # padding rows read the root row (harmless, dropped)
            query_rows[r, :q] = tr.token_start + np.arange(first, tr.num_nodes)
            valid.append(r * Q + np.arange(q))
            out_rows.append(query_rows[r, :q])
        device = block_table.device
        return cls(
            block_size=block_size,
            blocks=blocks,
            query_rows=torch.from_numpy(query_rows.reshape(-1)).to(device),
            valid=torch.from_numpy(np.concatenate(valid)).to(device),
            out_rows=torch.from_numpy(np.concatenate(out_rows)).to(device),
            num_requests=R,
            requests=requests,
            max_queries=Q,
            num_blocks=NB,
        )
