"""What the lookahead patches do inside vLLM's V1 ``GPUModelRunner`` (CPU runner included).

The replaced methods live in :mod:`vllm_lookahead.engine.patches`; each calls the
original and then one function here.  The data path of one step:

``_update_states``   drop state of finished requests, void drafts of preempted ones
``_prepare_inputs``  :func:`after_prepare_inputs`: lay out the trees the scheduler
                     sent (:mod:`.tree_batch`), rewrite draft RoPE positions to
                     ``context + depth`` (KV slots stay linear), choose logits rows
``execute_model``    forward with :func:`.attention.active_tree_batch` set, so the
                     attention wrapper applies the tree mask to draft rows
``_sample``          :func:`.verify_step.verify_step`: verify, compact KV, emit tokens
``propose_draft_token_ids`` -> :class:`.proposer.LookaheadProposer.propose`
                     (vLLM's own ``custom_class`` call): window slides, pool learns,
                     next trees are built
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from vllm_lookahead.engine.attention import unsupported_feature
from vllm_lookahead.engine.kv import SUPPORTED_BACKENDS, SUPPORTED_CPU_ISAS
from vllm_lookahead.engine.proposer import LookaheadProposer
from vllm_lookahead.engine.tree_batch import TreeBatch, build_tree_batch

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format


class RunnerLookahead:
    """Lookahead's per-runner state, stored on the runner as ``_lookahead``."""

    def __init__(self, runner: Any, proposer: LookaheadProposer) -> None:
        self.proposer = proposer
        self.batch: TreeBatch | None = None
        self.backend: str | None = None
        self.layer_caches: list[torch.Tensor] = []  # per-layer caches as attention reads them
        proposer.bind(runner)
        if runner.model_config.uses_mrope:
            raise NotImplementedError("lookahead: M-RoPE models are not supported")
        logger.info("lookahead decoding active: %s", proposer.config.summary())

    def setup_kv(self, runner: Any) -> None:
        """Called after the KV cache exists: pin the backend and check every layer is supported."""
        groups = runner.kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise NotImplementedError(
                f"lookahead: models with {len(groups)} KV cache groups (hybrid/sliding-window "
                "mixes) are not supported; only a single full-attention group is"
            )
        backend = runner.attn_groups[0][0].backend.get_name()
        if backend not in SUPPORTED_BACKENDS:
            raise NotImplementedError(
                f"lookahead: attention backend {backend} is not supported ({', '.join(SUPPORTED_BACKENDS)} are)"
            )
        ctx = runner.compilation_config.static_forward_context
        caches = []
        for name in groups[0].layer_names:
            layer = ctx[name]
            reason = unsupported_feature(layer.impl)
            if reason is not None:
                raise NotImplementedError(f"lookahead: layer {name} uses {reason}, which tree attention does not implement")
            isa = getattr(layer, "isa", None)
            if backend == "CPU_ATTN" and isa not in SUPPORTED_CPU_ISAS:
                raise NotImplementedError(
                    f"lookahead: CPU attention ISA {isa!r} packs its KV cache in a layout the tree "
                    f"path does not read yet (supported: {', '.join(SUPPORTED_CPU_ISAS)})"
                )
            kv = layer.kv_cache
            caches.append(kv[0] if isinstance(kv, (list, tuple)) else kv)
        self.backend = backend
        self.layer_caches = caches


_INSTANCE: RunnerLookahead | None = None  # one model runner per worker process


def current_tree_batch() -> TreeBatch | None:
    """The trees of the step being executed in this process (for module-level vLLM hooks)."""
    return _INSTANCE.batch if _INSTANCE is not None else None


def get_lookahead(runner: Any) -> RunnerLookahead | None:
    """The runner's lookahead state, created on first use; None when lookahead is off."""
    state = runner.__dict__.get("_lookahead", False)
    if state is False:
        drafter = getattr(runner, "drafter", None)
        state = RunnerLookahead(runner, drafter) if isinstance(drafter, LookaheadProposer) else None
        runner._lookahead = state
        if state is not None:
            global _INSTANCE
            _INSTANCE = state
    return state


def after_update_states(runner: Any, scheduler_output: Any) -> None:
    la = get_lookahead(runner)
    if la is None:
        return
    la.proposer.forget(scheduler_output.finished_req_ids)
    preempted = getattr(scheduler_output, "preempted_req_ids", None) or set()
    resumed = scheduler_output.scheduled_cached_reqs.resumed_req_ids
    la.proposer.on_preempted(set(preempted) | set(resumed))


def after_prepare_inputs(runner: Any, scheduler_output: Any, result: tuple) -> tuple:
    """Lay out trees, fix positions, choose logits rows; returns ``_prepare_inputs``' result."""
    la = get_lookahead(runner)
    if la is None:
        return result
    la.batch = None
    la.proposer.outcomes.clear()
    spec = scheduler_output.scheduled_spec_decode_tokens
    if not spec:
        return result
    ib = runner.input_batch
    num_reqs = ib.num_reqs
    qsl = runner.query_start_loc.np[: num_reqs + 1]
    batch = build_tree_batch(
        req_ids=list(ib.req_ids),
        scheduled_spec=spec,
        pending=la.proposer.pending,
        query_start_loc=qsl,
        num_scheduled=np.diff(qsl),
        num_computed=ib.num_computed_tokens_cpu[:num_reqs],
        device=runner.device,
    )
    if batch is None:
        return result
    rows, positions = batch.positions_update()
    runner.positions[torch.from_numpy(rows).to(runner.device)] = torch.from_numpy(positions).to(
        device=runner.device, dtype=runner.positions.dtype
    )
    total = int(qsl[-1])
    batch.slot_mapping = ib.block_table.block_tables[0].slot_mapping.gpu[:total]
    la.batch = batch
    _, spec_meta, max_sampled = result
    return batch.logits_indices, spec_meta, max_sampled
