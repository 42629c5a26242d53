"""Tree-masked attention for draft rows, folded into vLLM's paged-KV forward.

vLLM 0.32 ships no tree attention and its backends take only causal/non-causal
masks.  We keep vLLM's kernel for every row and then recompute the draft rows
of tree-carrying requests with the tree mask:

    for each tree request, each attention layer:
        K, V  <- the request's sequence gathered from the paged cache (context
                 + this step's rows, which the backend has just written)
        out[draft rows] = softmax(q k^T * scale + mask) v   with mask = context
                          | tree ancestors  (the two branches never see each other)

The root row keeps vLLM's own result (causal is already right for it), and
requests without drafts are untouched, so plain decoding keeps vLLM's kernels.
The path is plain torch (``scaled_dot_product_attention`` with GQA), so it runs
on CPU and, with the FlashAttention cache layout, on GPU (not measured here).

The wrapper is installed on the backend's ``AttentionImpl.forward`` (see
:mod:`vllm_lookahead.engine.patches`) and is inert unless the runner has set an
active :class:`~vllm_lookahead.engine.tree_batch.TreeBatch` for the current forward.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.nn.functional as F

from vllm_lookahead.engine.kv import gather_sequence, kv_views
from vllm_lookahead.engine.tree_batch import TreeBatch

_ACTIVE: Callable[[], TreeBatch | None] | None = None
_BACKEND: str | None = None
_LAYOUT_CHECKED = False


@contextlib.contextmanager
def active_tree_batch(provider: Callable[[], TreeBatch | None], backend: str):
    """While one forward runs, let the attention wrapper ask ``provider()`` for the step's trees.

    A provider rather than the batch itself because vLLM builds the inputs
    (``_prepare_inputs``) inside the same ``execute_model`` call that runs the forward.
    """
    global _ACTIVE, _BACKEND
    _ACTIVE, _BACKEND = provider, backend
    try:
        yield
    finally:
        _ACTIVE = None


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


def wrap_forward(original: Callable) -> Callable:
    """``AttentionImpl.forward`` replacement: vLLM's kernel, then tree rows fixed up."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, *args, **kwargs):
        result = original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        batch = _ACTIVE() if _ACTIVE is not None else None
        if batch is not None and attn_metadata is not None and getattr(self, "attn_type", "decoder") == "decoder":
            _fix_draft_rows(self, query, key, kv_cache, attn_metadata, output, batch)
        return result

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__lookahead_patch__ = True  # type: ignore[attr-defined]
    return forward


def _fix_draft_rows(impl, query, key, kv_cache, attn_metadata, output, batch: TreeBatch) -> None:
    global _LAYOUT_CHECKED
    heads, head_size = impl.num_heads, impl.head_size
    q_all = query.view(-1, heads, head_size)
    out_all = output.view(output.shape[0], heads, -1)
    k_view, v_view = kv_views(kv_cache, _BACKEND)
    block_table = attn_metadata.block_table
    for tr in batch.requests:
        n = tr.num_nodes
        length = tr.context_len + n
        blocks = block_table[tr.batch_index]
        k = gather_sequence(k_view, blocks, length)  # [Hkv, L, D]
        v = gather_sequence(v_view, blocks, length)
        if not _LAYOUT_CHECKED:
            _check_layout(k, key, tr)
            _LAYOUT_CHECKED = True
        q = q_all[tr.token_start + 1 : tr.token_start + n].transpose(0, 1)  # [H, n-1, D]
        o = F.scaled_dot_product_attention(
            q.unsqueeze(0).to(k.dtype),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=tr.mask,
            scale=impl.scale,
            enable_gqa=heads != k.shape[0],
        )[0]
        out_all[tr.token_start + 1 : tr.token_start + n] = o.transpose(0, 1).to(out_all.dtype)


def _check_layout(k_gathered: torch.Tensor, key: torch.Tensor, tr) -> None:
    """Once per process: the cache rows we read for this step must be the keys just written."""
    n = tr.num_nodes
    written = key.view(key.shape[0], k_gathered.shape[0], -1)[tr.token_start : tr.token_start + n]
    read = k_gathered[:, tr.context_len :].transpose(0, 1)
    if not torch.allclose(read.float(), written.float(), atol=1e-3, rtol=1e-3):
        raise RuntimeError(
            "vllm-lookahead: the KV cache layout of attention backend "
            f"{_BACKEND!r} is not the one this plugin reads (tree attention would be wrong); "
            "please report the vLLM version and backend"
        )
