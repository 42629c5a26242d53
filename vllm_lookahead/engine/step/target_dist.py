"""The target distribution at every node of a request's tree, as vLLM's sampler would make it.

Verification needs, at each node ``v`` with logits, what vLLM's ``Sampler`` would
sample the token after ``v`` from if the tokens on the path to ``v`` had been
generated one by one without speculation.  The steps and their order are the
sampler's (``vllm/v1/sample/sampler.py``), applied with vLLM's own ops; what
depends on the text so far is evaluated on the request's output plus the path:

1. logits in float32 (the grammar bitmask of structured output is already applied
   by vLLM's ``apply_grammar_bitmask``; such requests draft chains only, whose rows
   are the ones vLLM's grammar code computes masks for);
2. allowed token ids;
3. bad words (``past tokens`` = output + path);
4. min_tokens: stop tokens masked while ``len(output) + depth < min_tokens``
   (restored for structured output when nothing else is allowed, as vLLM does);
5. repetition / frequency / presence penalties (output + path);
6. greedy requests: the argmax; random ones: temperature, top-k/top-p
   (``apply_top_k_top_p``), softmax.

Not here, because lookahead does not draft for them (``eligibility.py``): min_p and
logit_bias (vLLM refuses them with speculation), generative scoring, custom logits
processors.  Nor the thinking-token budget's forcing: budgeted requests are drafted
only where it cannot apply to a draft row (``thinking_budget.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_SAMPLING_EPS = 1e-5  # vLLM's threshold for greedy (sampler.py)


@dataclass
class NodeRows:
    """The rows of one request's tree nodes that have logits."""

    batch_index: int
    nodes: np.ndarray  # node ids, ascending (the tree's logit nodes)
    depths: np.ndarray  # their depths
    paths: list[list[int]]  # per node: draft tokens from the root (excluded) down to the node (included)


def is_greedy(sampling_metadata: Any, batch_index: int) -> bool:
    if sampling_metadata.all_greedy:
        return True
    if sampling_metadata.all_random:
        return False
    return float(sampling_metadata.temperature[batch_index]) < _SAMPLING_EPS


def needs_processing(sampling_metadata: Any, batch_index: int, min_tokens_active: bool) -> bool:
    """Whether anything but temperature/top-k/top-p changes this request's logits (steps 2-5)."""
    sm = sampling_metadata
    if sm.allowed_token_ids_mask is not None and bool(sm.allowed_token_ids_mask[batch_index].any()):
        return True
    if batch_index in (sm.bad_words_token_ids or {}):
        return True
    if min_tokens_active:
        return True
    if not sm.no_penalties:
        i = batch_index
        if (
            float(sm.presence_penalties[i]) != 0.0
            or float(sm.frequency_penalties[i]) != 0.0
            or float(sm.repetition_penalties[i]) != 1.0
        ):
            return True
    return False


def processed_logits(
    logits: torch.Tensor,
    rows: NodeRows,
    sampling_metadata: Any,
    output_token_ids: Sequence[int],
    min_tokens: tuple[int, Sequence[int], bool] | None,
) -> torch.Tensor:
    """Steps 1-5 for one request's node rows (``logits``: [len(rows.nodes), vocab], not modified).

    ``min_tokens``: (min_tokens, stop token ids, uses structured output) while the
    request is short of min_tokens, else None.
    """
    from vllm.v1.sample.ops.bad_words import _apply_bad_words_single_batch
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    sm = sampling_metadata
    i = rows.batch_index
    out = logits.to(torch.float32, copy=True)
    m = out.shape[0]
    if sm.allowed_token_ids_mask is not None:
        out.masked_fill_(sm.allowed_token_ids_mask[i].unsqueeze(0), float("-inf"))
    past = [[*output_token_ids, *path] for path in rows.paths]
    bad_words = (sm.bad_words_token_ids or {}).get(i)
    if bad_words:
        for j in range(m):
            _apply_bad_words_single_batch(out[j], bad_words, past[j])
    if min_tokens is not None:
        _mask_stop_tokens(out, rows.depths, len(output_token_ids), *min_tokens)
    if not sm.no_penalties:
        index = torch.full((m,), i, dtype=torch.long, device=out.device)
        out = apply_all_penalties(
            out,
            sm.prompt_token_ids[index],
            sm.presence_penalties[index],
            sm.frequency_penalties[index],
            sm.repetition_penalties[index],
            past,
        )
    return out


def _mask_stop_tokens(
    logits: torch.Tensor,
    depths: np.ndarray,
    num_output: int,
    min_tokens: int,
    stop_token_ids: Sequence[int],
    structured: bool,
) -> None:
    stop = torch.tensor(sorted(stop_token_ids), dtype=torch.long, device=logits.device)
    if stop.numel() == 0:
        return
    for j, depth in enumerate(depths.tolist()):
        if num_output + depth >= min_tokens:
            continue
        before = logits[j, stop].clone()
        logits[j, stop] = float("-inf")
        if structured and bool(torch.isneginf(logits[j]).all()):
            logits[j, stop] = before  # vLLM restores them rather than leave nothing to sample


def sampling_logits(
    logits: torch.Tensor | None, sampling_metadata: Any, batch_index: int | Sequence[int], in_place: bool = False
) -> torch.Tensor:
    """Step 6 for random requests: temperature, then top-k/top-p (masked entries -inf); its
    softmax is the distribution vLLM's sampler draws from.  ``batch_index``: the request every
    row belongs to, or one per row (the rows of several requests in one pass, each with its own
    settings, as vLLM's sampler takes a batch: elementwise and row by row, so a row's result
    does not depend on the rows beside it).  ``in_place``: ``logits`` is the caller's to
    overwrite (a gathered copy), no new tensor is made for the temperature."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    assert logits is not None
    sm = sampling_metadata
    rows = [batch_index] * logits.shape[0] if isinstance(batch_index, int) else list(batch_index)
    at = torch.tensor(rows, dtype=torch.long, device=sm.temperature.device)
    temperature = sm.temperature[at].to(logits.dtype).unsqueeze(1)
    out = logits.div_(temperature) if in_place else logits.div(temperature)
    k = sm.top_k[at] if sm.top_k is not None else None  # gathers: vLLM's op may change k in place
    p = sm.top_p[at] if sm.top_p is not None else None
    return apply_top_k_top_p(out, k, p)
