"""Verification of one step's trees, in place of vLLM's rejection sampler.

vLLM's ``RejectionSampler`` assumes linear drafts.  For a step that carries trees
we instead:

1. sample every request's root row with vLLM's own ``Sampler`` (so plain
   requests in the same batch -- prefill chunks, requests without drafts,
   sampling requests -- get exactly what vLLM would give them);
2. take the argmax of every tree node with logits and run
   :func:`vllm_lookahead.core.greedy_verify` (longest candidate prefix matching
   the target's argmax chain, plus the bonus token);
3. move the accepted path's KV into the slots right after the root
   (:func:`vllm_lookahead.engine.kv.move_slots`) so vLLM's accounting
   ``num_computed_tokens += 1 + accepted`` describes the cache truthfully;
4. return a ``SamplerOutput`` shaped like the rejection sampler's
   (``[num_reqs, max_len]`` padded with -1), which vLLM's bookkeeping,
   scheduler and Prometheus stats consume unchanged, and one
   :class:`StepOutcome` per tree request, which the owner of the step
   (:class:`~vllm_lookahead.engine.runner.RunnerLookahead`) keeps for the
   next proposal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm_lookahead.core import StepDraft, greedy_verify
from vllm_lookahead.engine.kv import move_slots
from vllm_lookahead.engine.tree_batch import TreeBatch

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format
PLACEHOLDER = -1


@dataclass
class StepOutcome:
    """What the target forward said about one request's draft."""

    draft: StepDraft | None  # None: draft tokens the plugin did not make (run as a chain)
    num_nodes: int  # nodes actually run (the scheduler may truncate)
    argmax: np.ndarray  # (num_nodes,) target argmax per node, -1 where no logits
    num_accepted: int  # accepted draft tokens (the bonus token not counted)


def verify_step(runner: Any, logits: torch.Tensor, batch: TreeBatch) -> tuple[Any, dict[str, StepOutcome]]:
    """(vLLM ``SamplerOutput``, outcome per tree request id) for one step's logits."""
    from vllm.v1.outputs import LogprobsTensors, SamplerOutput

    num_reqs = runner.input_batch.num_reqs
    sampled = runner.sampler(logits=logits[batch.sample_rows], sampling_metadata=runner.input_batch.sampling_metadata)
    root_tokens = sampled.sampled_token_ids[:num_reqs, 0].tolist()
    tree_argmax = logits[batch.tree_logit_rows].argmax(dim=-1).cpu().numpy()

    outputs: list[list[int]] = [[t] for t in root_tokens]
    outcomes: dict[str, StepOutcome] = {}
    src_slots: list[int] = []
    dst_slots: list[int] = []
    cursor = 0
    for tr in batch.requests:
        n = tr.num_nodes
        argmax = np.full(n, -1, dtype=np.int64)
        k = len(tr.logit_nodes)
        argmax[tr.logit_nodes] = tree_argmax[cursor : cursor + k]
        cursor += k
        root_token = root_tokens[tr.batch_index]
        if argmax[0] != root_token:
            # Cannot happen for eligible (greedy, unprocessed) requests; stay exact if it does.
            logger.warning("lookahead: sampler and argmax disagree at the root of %s; drafts ignored", tr.req_id)
            path, bonus = np.zeros(0, dtype=np.int64), root_token
        else:
            path, bonus = greedy_verify(tr.tree, argmax)
        outputs[tr.batch_index] = [*tr.tree.tokens[path].tolist(), int(bonus)]
        for depth, node in enumerate(path.tolist(), start=1):
            if node != depth:
                src_slots.append(tr.token_start + node)
                dst_slots.append(tr.token_start + depth)
        outcomes[tr.req_id] = StepOutcome(tr.draft, n, argmax, len(path))

    if src_slots:
        assert batch.slot_mapping is not None and batch.kv is not None
        slot_mapping = batch.slot_mapping
        rows_src = torch.tensor(src_slots, device=slot_mapping.device)
        rows_dst = torch.tensor(dst_slots, device=slot_mapping.device)
        move_slots(batch.kv.layer_caches, batch.kv.backend, slot_mapping[rows_src].long(), slot_mapping[rows_dst].long())

    max_len = max(len(o) for o in outputs)
    token_ids = torch.full((num_reqs, max_len), PLACEHOLDER, dtype=torch.int32)
    for i, out in enumerate(outputs):
        token_ids[i, : len(out)] = torch.tensor(out, dtype=torch.int32)
    token_ids = token_ids.to(sampled.sampled_token_ids.device)

    logprobs = sampled.logprobs_tensors
    if logprobs is not None and max_len > 1:
        logprobs = _spread_logprobs(logprobs, num_reqs, max_len, LogprobsTensors)
    return SamplerOutput(sampled_token_ids=token_ids, logprobs_tensors=logprobs), outcomes


def _spread_logprobs(lp, num_reqs: int, max_len: int, cls):
    """Logprobs rows are per generated token (row-major over [num_reqs, max_len]).

    Only requests that sampled a single token may ask for logprobs (drafting is
    disabled for requests with logprobs), so each request's row goes to column 0.
    """
    rows = torch.arange(num_reqs, device=lp.logprobs.device) * max_len

    def spread(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((num_reqs * max_len, *t.shape[1:]), dtype=t.dtype, device=t.device)
        out[rows] = t[:num_reqs]
        return out

    return cls(spread(lp.logprob_token_ids), spread(lp.logprobs), spread(lp.selected_token_ranks))
