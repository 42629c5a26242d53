"""Verification of one step's trees, in place of vLLM's rejection sampler.

vLLM's ``RejectionSampler`` assumes linear drafts.  For a step that carries trees
we instead:

1. sample every request's root row with vLLM's own ``Sampler`` (so plain
   requests in the same batch -- prefill chunks, requests without drafts --
   get exactly what vLLM would give them);
2. per tree request, the target distribution at every node with logits, as
   vLLM's sampler would make it for the text up to that node
   (:mod:`.target_dist`: masks, bad words, min_tokens, penalties on output +
   path; temperature, top-k/top-p);
   greedy requests: :func:`vllm_lookahead.core.greedy_verify` against its argmax
   (longest match plus the bonus token; the root must agree with vLLM's own
   sample); random ones: :func:`vllm_lookahead.core.sampling.coupled_walks`, the walk
   coupled to the noise vLLM's sampler draws per token (:mod:`.sampler_noise`; the root's
   token is vLLM's own sample), so a seeded request emits the tokens vLLM emits without
   speculation, the step's walks taken a position at a time (one sampling pass per position
   over every request still walking; requests without a seed draw the nodes along the target's
   argmax in one pass before, :func:`_ahead`) -- or, for sampler implementations without such noise, SpecInfer's
   multi-candidate rule (:func:`~vllm_lookahead.core.sampling.tree_speculative_sample`);
   both exact in distribution;
3. move the accepted path's KV into the slots right after the root
   (:meth:`vllm_lookahead.engine.step.kv.PagedKV.move`) so vLLM's accounting
   ``num_computed_tokens += 1 + accepted`` describes the cache truthfully;
4. return a ``SamplerOutput`` shaped like the rejection sampler's
   (``[num_reqs, max_len]`` padded with -1; logprobs of every emitted token
   from the row it was emitted after, in the engine's logprobs mode), which
   vLLM's bookkeeping, scheduler and Prometheus stats consume unchanged, and one
   :class:`StepOutcome` per tree request, which the owner of the step
   (:class:`~vllm_lookahead.engine.runner.RunnerLookahead`) keeps for the
   next proposal.

:func:`verify_step` reads what the device computed (every node's argmax, the rows the plans keep,
vLLM's sample at the roots); :func:`verify_trees` is the host's part from there on (steps 2-3 and
the emitted tokens), which the host-work benchmark (``benchmarks/host_work``) replays with recorded
argmaxes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import torch

from vllm_lookahead.core import StepDraft, greedy_verify
from vllm_lookahead.core.sampling import Forest, coupled_walks, tree_speculative_sample
from vllm_lookahead.engine.step import target_dist
from vllm_lookahead.engine.step.sampler_noise import SamplerNoise
from vllm_lookahead.engine.step.tree_batch import TreeBatch

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format
PLACEHOLDER = -1


@dataclass
class StepOutcome:
    """What the target forward said about one request's draft."""

    draft: StepDraft | None  # None: draft tokens the plugin did not make (run as a chain)
    num_nodes: int  # nodes actually run (the scheduler may truncate)
    argmax: np.ndarray  # (num_nodes,) target argmax per node, -1 where no logits
    path: np.ndarray  # the accepted node ids, depth 1 down
    greedy: bool = True  # verified against the argmax (else sampled)
    seconds: float = 0.0  # host time this request's verification took beyond sampling its tokens
    sampling_seconds: float = 0.0  # host time its walk took sampling the tokens after accepted ones

    @property
    def num_accepted(self) -> int:
        """Accepted draft tokens (the bonus token not counted)."""
        return len(self.path)

    @cached_property
    def path_sources(self) -> list[int]:
        """Each accepted node's :class:`~vllm_lookahead.core.Source`, in path order (0 in a chain
        the plugin did not draft): worked out once, the stats and the step's report both read it."""
        sources = self.draft.sources if self.draft is not None else None
        return sources[self.path].tolist() if sources is not None else [0] * len(self.path)


def _compact(batch: TreeBatch, src_rows: list[int], dst_rows: list[int]) -> None:
    """Move the accepted paths' KV from their tree rows to the rows right after their roots."""
    if not src_rows:
        return
    assert batch.kv is not None
    slot_mapping = batch.slots()
    # both lists in one copy to the device and one gather (each torch call costs the step's thread)
    slots = slot_mapping[torch.tensor(src_rows + dst_rows, device=slot_mapping.device)].long()
    batch.kv.move(slots[: len(src_rows)], slots[len(src_rows) :])


def verify_step(runner: Any, logits: torch.Tensor, batch: TreeBatch) -> tuple[Any, dict[str, StepOutcome]]:
    """(vLLM ``SamplerOutput``, outcome per tree request id) for one step's logits."""
    from vllm.v1.outputs import SamplerOutput

    sm, num_reqs = runner.input_batch.sampling_metadata, runner.input_batch.num_reqs
    # Before the sampler, which may change the rows it is given in place: every node's argmax, and
    # a copy of the rows of the tree requests that need more than that (sampled, processed, logprobs).
    tree_argmax = _node_argmax(logits, batch, num_reqs)
    plans = plan_trees(runner.requests, sm, batch)
    kept = _kept_rows(logits, batch, plans)
    roots = logits[:num_reqs] if batch.sample_rows is None else logits[batch.sample_rows]  # roots first: no copy
    sampled = sample_one_row_per_request(runner.sampler, roots, sm)
    root_tokens = sampled.sampled_token_ids[:num_reqs, 0].tolist()
    verified = verify_trees(sm, batch, plans, kept, tree_argmax, root_tokens, SamplerNoise.of(runner.sampler))

    emitted_rows: dict[int, tuple[torch.Tensor, list[int]]] = {}  # batch index -> (logprob rows, tokens)
    if sm.max_num_logprobs is not None:
        for item in verified.items:
            t0 = time.perf_counter()
            emitted_rows[item.tr.batch_index] = (_logprob_rows(runner, sm, item), verified.outputs[item.tr.batch_index])
            verified.outcomes[item.tr.req_id].seconds += time.perf_counter() - t0
    max_len = max(len(o) for o in verified.outputs)
    token_ids = verified.token_grid(max_len).to(sampled.sampled_token_ids.device)
    logprobs = _logprobs_grid(runner, sampled.logprobs_tensors, sm, num_reqs, max_len, emitted_rows)
    return SamplerOutput(sampled_token_ids=token_ids, logprobs_tensors=logprobs), verified.outcomes


@dataclass
class TreesVerified:
    """The host's part of one step's verification (:func:`verify_trees`)."""

    outputs: list[list[int]]  # per request in the batch: its emitted tokens (plain ones: the sampled root token)
    outcomes: dict[str, StepOutcome]  # per tree request
    items: list[_Verifying]

    def token_grid(self, max_len: int) -> torch.Tensor:
        """``[num_reqs, max_len]`` emitted tokens padded with :data:`PLACEHOLDER` (the rejection
        sampler's layout).  Every request emits a first token; only those whose drafts were
        accepted emit more, written row by row (fewer numpy calls than one masked write of all)."""
        outputs = self.outputs
        grid = np.full((len(outputs), max_len), PLACEHOLDER, dtype=np.int32)
        grid[:, 0] = [tokens[0] for tokens in outputs]
        for r, tokens in enumerate(outputs):
            if len(tokens) > 1:
                grid[r, 1 : len(tokens)] = tokens[1:]
        return torch.from_numpy(grid)


def plan_trees(requests: Any, sm: Any, batch: TreeBatch) -> list[_Plan]:
    """Each tree request's verification plan (``requests``: vLLM's per-request states by id)."""
    return [_plan(requests[tr.req_id], sm, tr) for tr in batch.requests]


def verify_trees(
    sm: Any,
    batch: TreeBatch,
    plans: list[_Plan],
    kept: KeptRows | None,
    tree_argmax: np.ndarray,
    root_tokens: list[int],
    noise: SamplerNoise | None,
) -> TreesVerified:
    """The host's part of a step's verification, given what the device computed -- every tree
    node's argmax (``batch.tree_logit_rows`` order), the kept rows of the requests that read
    more than that, vLLM's sample at every root: each tree request's path (greedy match, or the
    walk coupled to the sampler's ``noise``), the step's emitted tokens, and the accepted paths'
    KV moved into place (:meth:`~vllm_lookahead.engine.step.kv.PagedKV.move`)."""
    items = []
    cursor = 0
    for tr, plan in zip(batch.requests, plans, strict=True):
        k = len(tr.logit_nodes)
        if k == tr.num_nodes:  # every node has logits (a lead's chain)
            argmax = np.asarray(tree_argmax[cursor : cursor + k], dtype=np.int64)  # a view: read only
        else:
            argmax = np.full(tr.num_nodes, -1, dtype=np.int64)
            argmax[tr.logit_nodes] = tree_argmax[cursor : cursor + k]
        t0 = time.perf_counter()
        items.append(_prepare(sm, tr, plan, kept, argmax, root_tokens[tr.batch_index], walks=noise is not None))
        items[-1].seconds += time.perf_counter() - t0
        cursor += k
    _walk_together(noise, sm, [item for item in items if item.path is None], kept)

    outputs: list[list[int]] = [[t] for t in root_tokens]
    outcomes: dict[str, StepOutcome] = {}
    src_slots: list[int] = []
    dst_slots: list[int] = []
    for item in items:
        tr, path = item.tr, item.path
        assert path is not None
        nodes, tokens = path.tolist(), tr.tree.token_list
        outputs[tr.batch_index] = [*(tokens[node] for node in nodes), item.last]
        for depth, node in enumerate(nodes, start=1):
            if node != depth:
                src_slots.append(tr.token_start + node)
                dst_slots.append(tr.token_start + depth)
        outcomes[tr.req_id] = StepOutcome(
            tr.draft, tr.num_nodes, item.argmax, path, item.greedy, item.seconds, item.sampling_seconds
        )
    _compact(batch, src_slots, dst_slots)
    return TreesVerified(outputs, outcomes, items)


def sample_one_row_per_request(sampler: Any, logits: torch.Tensor, sampling_metadata: Any) -> Any:
    """vLLM's ``Sampler`` over one row per request (the roots of this step's drafts, or a step
    without drafts), exactly as vLLM samples without speculation.

    The one state that differs: vLLM's thinking-budget holder (``ThinkingBudgetStateHolder``),
    built in speculative mode, finds a request's row by the draft lengths before it
    (``cu_num_tokens``, the rejection sampler's target layout) and would force the end-of-thinking
    token into another request's row here.  Only root rows can be forced (budgeted requests are
    drafted only where no draft row can be, :mod:`vllm_lookahead.engine.propose.thinking_budget`), so for this
    call the holder
    takes its non-speculative layout (one row per request, no drafts) and is put back after it.
    """
    holder = getattr(sampling_metadata, "thinking_budget_state_holder", None)
    if holder is None or not holder.has_tracked_requests():
        return sampler(logits=logits, sampling_metadata=sampling_metadata)
    spec_mode = holder.in_spec_mode
    holder.in_spec_mode = False
    try:
        return sampler(logits=logits, sampling_metadata=replace(sampling_metadata, spec_token_ids=None))
    finally:
        holder.in_spec_mode = spec_mode


@dataclass
class _Verifying:
    """One tree request through verification: its rows, its target distribution, then its path."""

    tr: Any  # the TreeRequest
    kept: KeptRows | None  # the step's kept rows (its own among them where its plan reads more than the argmax)
    argmax: np.ndarray  # (num_nodes,) argmax per node, -1 without logits
    greedy: bool
    processed_rows: torch.Tensor | None  # its rows after steps 1-5 of target_dist where 2-5 apply, else None
    root_token: int  # vLLM's own sample after the root
    first_row: int | None = None  # where ``processed`` is a block of the step's kept rows in float32: its first row
    path: np.ndarray | None = None  # the accepted node ids, depth 1 down (None: its walk is still to come)
    last: int = -1  # the token after them (bonus or residual sample)
    seconds: float = 0.0  # host time spent on it (its rows, its target distribution, the greedy match)
    sampling_seconds: float = 0.0  # host time its walk spent sampling tokens after accepted nodes
    _sampling: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def rows(self) -> torch.Tensor | None:
        """Its logit rows, as the forward returned them (None: its argmax is all it needs)."""
        return self.kept.of(self.tr.req_id) if self.kept is not None else None

    @cached_property
    def processed(self) -> torch.Tensor | None:
        """Its rows after steps 1-5 of target_dist (None: a greedy request with nothing to apply):
        taken from the step's kept rows in float32 on first use, where nothing but temperature and
        top-k/top-p applies -- a walk whose rows are gathered from there never asks."""
        if self.processed_rows is not None:
            return self.processed_rows
        return self.kept.of(self.tr.req_id, float32=True) if self.first_row is not None else None

    def row_of(self, node: int) -> int:
        return int(np.searchsorted(self.tr.logit_nodes, node))

    def sampling_row(self, sm: Any, node: int) -> torch.Tensor:
        """Temperature and top-k/top-p for one node's row (only for the nodes a walk reaches)."""
        if node not in self._sampling:
            assert self.processed is not None
            self._sampling[node] = target_dist.sampling_logits(
                self.processed[self.row_of(node)].unsqueeze(0), sm, self.tr.batch_index
            )[0]
        return self._sampling[node]


def row_argmax(logits: torch.Tensor) -> np.ndarray:
    """Every row's argmax, the first index on ties, as vLLM's greedy sampler takes it (float32
    first, then ``argmax``).  A float32 tensor on the CPU is read through numpy, whose argmax takes
    ~0.05 ms where torch's takes ~0.3 ms for 24 rows of a 49,152-token vocabulary (2-core EPYC);
    both return the first maximum, and a NaN as the maximum, so the index is the same."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.numpy().argmax(axis=-1)
    return logits.to(torch.float32).argmax(dim=-1).cpu().numpy()


def _node_argmax(logits: torch.Tensor, batch: TreeBatch, num_reqs: int) -> np.ndarray:
    """The argmax of every tree row (``batch.tree_logit_rows`` order).  Roots first, the rows after
    the roots are all tree rows, read in place, and of the roots only the tree requests' are read
    (one small gather), not those of the step's plain requests; request by request the logits
    hold little but tree rows and are read whole."""
    rows = batch.tree_logit_rows
    if not batch.roots_first:
        return row_argmax(logits)[rows]
    out = np.empty(len(rows), dtype=np.int64)
    is_root = rows < num_reqs
    out[~is_root] = row_argmax(logits[num_reqs:])[rows[~is_root] - num_reqs]
    out[is_root] = row_argmax(logits[torch.from_numpy(rows[is_root]).to(logits.device)])
    return out


# not frozen: made per request and step, where a frozen dataclass's init costs 2-3x (design.md, "A step's records")
@dataclass(slots=True)
class _Plan:
    """What one tree request's verification needs, known before the sampler runs."""

    greedy: bool
    min_tokens: tuple | None  # (min_tokens, stop token ids, structured) while min_tokens is unmet
    process: bool  # anything but temperature and top-k/top-p changes its logits (target_dist steps 2-5)
    rows: bool  # its logit rows must be kept: more than their argmax is read
    output: list[int]  # its output tokens so far (penalties and min_tokens read them)


def _plan(state: Any, sm: Any, tr: Any) -> _Plan:
    i = tr.batch_index
    sp, output = state.sampling_params, state.output_token_ids
    min_tokens = None
    if sp is not None and sp.min_tokens and len(output) < sp.min_tokens:
        min_tokens = (sp.min_tokens, sp.all_stop_token_ids, sp.structured_outputs is not None)
    greedy = target_dist.is_greedy(sm, i)
    process = target_dist.needs_processing(sm, i, min_tokens is not None)
    return _Plan(greedy, min_tokens, process, not greedy or process or sm.max_num_logprobs is not None, output)


@dataclass
class KeptRows:
    """The logit rows of a step's tree requests whose plans read more than their argmax: one
    tensor (one gather on the device), each request's rows a block of it."""

    rows: torch.Tensor
    blocks: dict[str, tuple[int, int]]  # request id -> (its first row, its row count)
    _float32: torch.Tensor | None = None

    def of(self, req_id: str, float32: bool = False) -> torch.Tensor | None:
        """The request's rows (None if not kept), as the forward returned them or in float32 (the
        whole tensor converted once, the first time it is asked for)."""
        block = self.blocks.get(req_id)
        if block is None:
            return None
        rows = self.float32() if float32 else self.rows
        return rows[block[0] : block[0] + block[1]]

    def float32(self) -> torch.Tensor:
        if self._float32 is None:
            self._float32 = self.rows.to(torch.float32)
        return self._float32


def _kept_rows(logits: torch.Tensor, batch: TreeBatch, plans: list[_Plan]) -> KeptRows | None:
    """The rows of the tree requests whose plans read them (one gather for all); a greedy request
    verified by its argmax alone needs none."""
    spans, cursor = [], 0
    for tr, plan in zip(batch.requests, plans, strict=True):
        k = len(tr.logit_nodes)
        if plan.rows:
            spans.append((tr.req_id, cursor, k))
        cursor += k
    if not spans:
        return None
    index = np.concatenate([batch.tree_logit_rows[start : start + k] for _, start, k in spans])
    blocks, at = {}, 0
    for req_id, _, k in spans:
        blocks[req_id] = (at, k)
        at += k
    return KeptRows(logits[torch.from_numpy(index).to(logits.device)], blocks)


def _prepare(
    sm: Any, tr: Any, plan: _Plan, kept: KeptRows | None, argmax: np.ndarray, root_token: int, walks: bool
) -> _Verifying:
    """One tree request's target distribution, and its path where it needs no walk: greedy ones
    (longest match with the target's argmax) and, where the sampler's noise cannot be mirrored
    (``walks`` False), random ones (:func:`~vllm_lookahead.core.sampling.tree_speculative_sample`).
    Its logit rows come from ``kept`` (none where ``plan.rows`` is False)."""
    i = tr.batch_index
    greedy = plan.greedy
    processed = None
    first_row = None
    if plan.process:
        assert kept is not None
        node_rows = target_dist.NodeRows(
            i, tr.logit_nodes, tr.tree.depths[tr.logit_nodes], _paths(tr.tree, tr.logit_nodes)
        )
        processed = target_dist.processed_logits(kept.of(tr.req_id), node_rows, sm, plan.output, plan.min_tokens)
    elif not greedy:
        assert kept is not None
        first_row = kept.blocks[tr.req_id][0]  # nothing but temperature and top-k/top-p to apply
    item = _Verifying(tr, kept, argmax, greedy, processed, root_token, first_row)
    if greedy:
        target = argmax
        if processed is not None:
            target = np.full_like(argmax, -1)
            target[tr.logit_nodes] = row_argmax(processed)
        if target[0] != root_token:
            # vLLM's sampler and this module disagree on the root (fp rounding of a tie): its token stands.
            logger.warning("lookahead: sampler and argmax disagree at the root of %s; drafts ignored", tr.req_id)
            item.path, item.last = np.zeros(0, dtype=np.int64), root_token
        else:
            item.path, item.last = greedy_verify(tr.tree, target)
    elif not walks:
        # SpecInfer's rule over the same distributions, uniforms from the request's generator.
        def probs(node: int) -> np.ndarray:
            return item.sampling_row(sm, node).softmax(dim=-1, dtype=torch.float32).to(torch.float64).cpu().numpy()

        draws = _uniforms(sm.generators.get(i), tr.tree.size + 1)
        item.path, item.last = tree_speculative_sample(tr.tree, probs, lambda: next(draws))
    item.last = int(item.last)
    return item


def _walk_together(noise: SamplerNoise | None, sm: Any, items: list[_Verifying], kept: KeptRows | None) -> None:
    """The random requests' paths, coupled to vLLM's sampler noise
    (:func:`~vllm_lookahead.core.sampling.coupled_walks`): the root's token is the one vLLM's
    sampler drew, each accepted node's next token drawn with the noise that sampler would draw
    for that position -- a seeded request emits vLLM's own tokens -- one sampling pass per
    position over every walk still going, its time shared among their requests.  That time is each
    request's ``sampling_seconds``, apart from its other verification: every pass samples a token
    that vLLM's sampler would sample in a later step without speculation, so it is a price per
    accepted token, not per tree (:meth:`~vllm_lookahead.engine.propose.step_timing.StepTiming.token_seconds`).
    Requests without a seed draw the nodes along the target's argmax in one pass first (:func:`_ahead`),
    and later passes sample only the nodes off it.  Where every walking request's rows are a block
    of the step's kept rows (nothing but temperature and top-k/top-p to apply), a pass's rows are
    one gather from them."""
    if not items:
        return
    assert noise is not None
    shared = kept.float32() if kept is not None and all(item.first_row is not None for item in items) else None

    def sample_after(reached: list[tuple[int, int]], index: np.ndarray | None = None) -> list[int]:
        """The tokens after ``reached`` ``(walk, node)`` pairs (``index``: their rows in ``shared``)."""
        t0 = time.perf_counter()
        walking = [(items[w], node) for w, node in reached]
        if shared is not None:
            if index is None:
                index = np.array([item.first_row + item.row_of(node) for item, node in walking], dtype=np.int64)
            processed = shared.index_select(0, torch.from_numpy(index).to(shared.device))
        else:
            processed = torch.stack([item.processed[item.row_of(node)] for item, node in walking])
        # the rows are a gathered copy: tempered in place
        rows = target_dist.sampling_logits(processed, sm, [item.tr.batch_index for item, _ in walking], in_place=True)
        if sm.max_num_logprobs is not None:  # the processed logprobs modes read them again
            for (item, node), row in zip(walking, rows, strict=True):
                item._sampling[node] = row
        tokens = noise.sample_rows(rows, [sm.generators.get(item.tr.batch_index) for item, _ in walking])
        share = (time.perf_counter() - t0) / len(reached)
        for item, _ in walking:
            item.sampling_seconds += share
        return tokens

    forest = Forest([item.tr.tree for item in items])
    ahead = _ahead(forest, sm, items)
    drawn = None
    if ahead.size:
        drawn = np.full(forest.size, -1, dtype=np.int64)
        walk, index = forest.walk[ahead], None
        if shared is not None:  # their rows in ``shared``: the tree's first row + the node's rank among its logit nodes
            rank = np.cumsum(forest.logits) - 1
            first = np.fromiter((item.first_row for item in items), dtype=np.int64, count=len(items))
            index = first[walk] + rank[ahead] - rank[forest.offsets[walk]]
        drawn[ahead] = sample_after(list(zip(walk.tolist(), forest.node[ahead].tolist())), index)
    walked = coupled_walks([(item.tr.tree, item.root_token) for item in items], sample_after, forest, drawn)
    for item, (path, last) in zip(items, walked, strict=True):
        item.path, item.last = path, int(last)


def _ahead(forest: Forest, sm: Any, items: list[_Verifying]) -> np.ndarray:
    """The nodes (of ``forest``) whose tokens are drawn before the walks (``drawn`` of
    :func:`~vllm_lookahead.core.sampling.coupled_walks`), in one sampling pass, for the requests
    without a seed: every node a walk reaches while each token drawn is the target's argmax there
    (:meth:`~vllm_lookahead.core.sampling.Forest.followed`; at the root, the token vLLM's sampler
    drew) -- where a sampled walk mostly goes -- so that a step mostly samples once rather than once
    per accepted position (on a GPU one read-back and one pass of fixed costs instead of one per
    position).  Exact in distribution: each such token is drawn from its node's distribution with a
    uniform of its own.  A seeded request's walk draws from its generator one token per emitted
    position, in order, as vLLM's sampler does."""
    free = np.fromiter((sm.generators.get(item.tr.batch_index) is None for item in items), dtype=bool, count=len(items))
    if not free.any():
        return np.zeros(0, dtype=np.int64)
    next_token = np.concatenate([item.argmax for item in items])
    next_token[forest.offsets] = [item.root_token for item in items]
    return np.flatnonzero(forest.followed(next_token) & (forest.node > 0) & free[forest.walk])


def _logprob_rows(runner: Any, sm: Any, item: _Verifying) -> torch.Tensor:
    """The rows the emitted tokens' logprobs come from: each token's is the row of the node it
    was emitted after, in the engine's logprobs mode -- raw (vLLM's default) or processed (as
    vLLM's sampler returns them)."""
    assert item.path is not None
    emitted_from = [0, *item.path.tolist()]
    mode = runner.sampler.logprobs_mode
    if mode.startswith("raw") or item.processed is None:
        lp = item.rows.index_select(0, _row_index(item, emitted_from)).to(torch.float32)
    elif item.greedy:
        lp = item.processed.index_select(0, _row_index(item, emitted_from))
    else:  # processed modes of a random request: the rows it was sampled from
        lp = torch.stack([item.sampling_row(sm, node) for node in emitted_from]).to(torch.float32)
    if mode.endswith("logprobs"):
        lp = lp.log_softmax(dim=-1, dtype=torch.float32)
    return lp


def _row_index(item: _Verifying, nodes: list[int]) -> torch.Tensor:
    return torch.tensor([item.row_of(node) for node in nodes], device=item.rows.device)


def _paths(tree: Any, nodes: np.ndarray) -> list[list[int]]:
    """Per node: the draft tokens from below the root down to the node."""
    paths: list[list[int]] = [[]]
    tokens, parents = tree.tokens, tree.parents
    for node in range(1, int(nodes.max()) + 1 if nodes.size else 1):
        paths.append([*paths[int(parents[node])], int(tokens[node])])
    return [paths[int(n)] for n in nodes.tolist()]


def _uniforms(generator: torch.Generator | None, count: int) -> Iterator[float]:
    """``count`` U[0, 1) draws, from the request's own generator when it has a seed (then the
    same per step whatever the outcome, so seeded requests reproduce); more if ever needed."""
    while True:
        values = (
            torch.rand(count, generator=generator, dtype=torch.float64)
            if generator is not None
            else torch.rand(count, dtype=torch.float64)
        )
        yield from values.tolist()


def _logprobs_grid(
    runner: Any,
    sampled_lp: Any,
    sm: Any,
    num_reqs: int,
    max_len: int,
    emitted_rows: dict[int, tuple[torch.Tensor, list[int]]],
) -> Any:
    """Logprobs of every emitted token, row ``i * max_len + j`` for request ``i``'s ``j``-th token
    (the layout vLLM's rejection sampler returns and its output parsing reads).  Plain rows
    keep what vLLM's sampler computed; tree requests get their emitted tokens' rows."""
    from vllm.v1.outputs import LogprobsTensors

    if sampled_lp is None:
        return None
    if max_len == 1 and not emitted_rows:
        return sampled_lp
    width = sampled_lp.logprobs.shape[1]
    device = sampled_lp.logprobs.device

    def grid(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros((num_reqs * max_len, *t.shape[1:]), dtype=t.dtype, device=t.device)

    ids, lps, ranks = (
        grid(sampled_lp.logprob_token_ids),
        grid(sampled_lp.logprobs),
        grid(sampled_lp.selected_token_ranks),
    )
    plain = torch.tensor([i for i in range(num_reqs) if i not in emitted_rows], dtype=torch.long, device=device)
    if plain.numel():
        ids[plain * max_len] = sampled_lp.logprob_token_ids[plain]
        lps[plain * max_len] = sampled_lp.logprobs[plain]
        ranks[plain * max_len] = sampled_lp.selected_token_ranks[plain]
    for i, (rows, tokens) in emitted_rows.items():
        got = runner.sampler.gather_logprobs(
            rows, width - 1, torch.tensor(tokens, dtype=torch.int64, device=rows.device)
        )
        where = i * max_len + torch.arange(len(tokens), device=device)
        ids[where] = got.logprob_token_ids.to(ids.dtype)
        lps[where] = got.logprobs.to(lps.dtype)
        ranks[where] = got.selected_token_ranks.to(ranks.dtype)
    return LogprobsTensors(ids, lps, ranks)
