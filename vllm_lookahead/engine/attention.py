"""Tree-masked attention for draft rows, folded into vLLM's paged-KV forward.

vLLM 0.32 ships no tree attention and its backends take only causal/non-causal
masks.  We keep vLLM's kernel for every row and then recompute the draft rows
of tree-carrying requests with the tree mask:

    each attention layer, all tree requests at once (padded, see
    tree_batch.PaddedDraftRows):
        K, V  <- the requests' blocks gathered from the paged cache (context
                 + this step's rows, which the backend has just written)
        out[draft rows] = softmax(q k^T * scale + mask) v   with mask = context
                          | tree ancestors  (the two branches never see each other)

The root row keeps vLLM's own result (causal is already right for it), and so
do the draft rows of a tree's leading chain (the first candidate below the
root: its causal view is its tree view); a step whose trees are all chains --
one candidate, no window -- runs vLLM's kernels only.  Requests without drafts
are untouched, so plain decoding keeps vLLM's kernels.  The path is plain torch
(two matmuls and a softmax; grouped-query heads are stacked as extra query rows
rather than K/V expanded), so it runs on CPU and, reading the cache layout of
vLLM's FlashAttention, Triton and FlashInfer backends (:mod:`.kv`), on a GPU --
which has never been done here: this project has no GPU.

The replacement of the backend's ``AttentionImpl.forward`` lives in the patch
table (:mod:`vllm_lookahead.engine.patches`): it runs vLLM's kernel, then
:func:`fix_draft_rows` when the step's :class:`~vllm_lookahead.engine.tree_batch.TreeBatch`
(``runner.current_tree_batch()``) has branching trees.  Everything here is plain
functions of the batch, so it is tested on CPU against a dense reference for every
cache layout (tests/unit/test_tree_attention.py, test_gpu_kv_layouts.py).
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_lookahead.engine.kv import gather_blocks
from vllm_lookahead.engine.tree_batch import TreeBatch


def unsupported_feature(impl: Any) -> str | None:
    """Why the tree path cannot reproduce this attention layer, or None."""
    if getattr(impl, "alibi_slopes", None) is not None:
        return "ALiBi"
    sw = getattr(impl, "sliding_window", None)
    if sw not in (None, -1, (-1, -1)):
        return "sliding-window attention"
    if getattr(impl, "logits_soft_cap", None) not in (None, 0, 0.0):
        return "attention logit soft-capping"
    if getattr(impl, "sinks", None) is not None:
        return "attention sinks"
    if str(getattr(impl, "kv_cache_dtype", "auto")) not in ("auto", "float32", "bfloat16", "float16"):
        return f"quantized KV cache ({impl.kv_cache_dtype})"
    return None


def fix_draft_rows(impl: Any, query: torch.Tensor, key: torch.Tensor, kv_cache: torch.Tensor,
                   output: torch.Tensor, batch: TreeBatch) -> None:
    """Recompute the draft rows of ``batch``'s branching trees with the tree mask, in ``output``.

    ``impl`` is the backend's ``AttentionImpl`` (``num_heads``, ``head_size``, ``scale``);
    ``query``/``key``/``output`` are the layer's flattened-batch tensors and ``kv_cache``
    its paged cache, which already holds this step's keys and values.
    """
    if not batch.needs_tree_attention:  # every tree is a chain: vLLM's causal result is exact
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "vllm-lookahead: tree attention is being captured in a CUDA graph; it must run eagerly "
            "(cudagraph_mode PIECEWISE or NONE, see engine/startup.py)"
        )
    kv = batch.kv
    assert kv is not None
    batch.tree_attention_layers += 1
    heads, head_size = impl.num_heads, impl.head_size
    q_all = query.view(-1, heads, head_size)
    out_all = output.view(output.shape[0], heads, -1)
    block_size = kv.block_size
    rows = batch.draft_rows
    R, Q, NB = rows.num_requests, rows.max_queries, rows.num_blocks
    k_blocks, v_blocks = gather_blocks(kv_cache, kv.backend, rows.block_ids)  # [R*NB, Hkv, bs, D]
    hkv = k_blocks.shape[1]
    group = heads // hkv
    length = NB * block_size
    k = k_blocks.view(R, NB, hkv, block_size, -1).permute(0, 2, 4, 1, 3).reshape(R, hkv, -1, length)  # K^T
    v = v_blocks.view(R, NB, hkv, block_size, -1).permute(0, 2, 1, 3, 4).reshape(R, hkv, length, -1)
    if not kv.layout_checked:
        _check_layout(k[0].transpose(1, 2), key, rows.requests[0], kv.backend)
        kv.layout_checked = True
    # Grouped-query attention without expanding K/V: the `group` query heads that
    # share a KV head (head h uses KV head h // group) are stacked as extra rows.
    q = q_all.index_select(0, rows.query_rows).to(k.dtype)  # [R*Q, H, D]
    q = q.view(R, Q, hkv, group, head_size).permute(0, 2, 3, 1, 4).reshape(R, hkv, group * Q, head_size)
    scores = torch.matmul(q, k).mul_(impl.scale).add_(rows.bias_for(group, k.dtype))  # [R, Hkv, group*Q, L]
    o = torch.matmul(torch.softmax(scores, dim=-1), v)  # [R, Hkv, group*Q, D]
    o = o.view(R, hkv, group, Q, -1).permute(0, 3, 1, 2, 4).reshape(R * Q, heads, -1).index_select(0, rows.valid)
    out_all.index_copy_(0, rows.out_rows, o.to(out_all.dtype))


def _check_layout(k_gathered: torch.Tensor, key: torch.Tensor, tr, backend: str) -> None:
    """Once per process: the cache rows we read for this step must be the keys just written."""
    n = tr.num_nodes
    written = key.view(key.shape[0], k_gathered.shape[0], -1)[tr.token_start : tr.token_start + n]
    read = k_gathered[:, tr.context_len : tr.context_len + n].transpose(0, 1)
    if not torch.allclose(read.float(), written.float(), atol=1e-3, rtol=1e-3):
        raise RuntimeError(
            "vllm-lookahead: the KV cache layout of attention backend "
            f"{backend!r} is not the one this plugin reads (tree attention would be wrong); "
            "please report the vLLM version and backend"
        )
