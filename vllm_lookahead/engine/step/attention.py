"""Tree-masked attention for draft rows, folded into vLLM's paged-KV forward.

vLLM 0.32 ships no tree attention and its backends take only causal/non-causal
masks.  Per step, the rows of a tree request split in two:

* the root and the tree's *leading chain* (the first candidate below the root:
  its causal view is its tree view) keep vLLM's own kernel;
* the draft rows after it -- those that need the tree mask -- are computed here,
  every tree request of the step in one padded problem
  (:class:`~vllm_lookahead.engine.step.tree_batch.PaddedDraftRows`), each layer::

      K^T, V <- the requests' blocks, read from the paged cache as rows
                (context + this step's rows, which the backend has just written)
      out[draft rows] = softmax(q K^T * scale + mask) V   mask = context | tree ancestors

  -- one ``index_select`` each for queries, keys and values (the row indices are
  built once per step: :class:`_Plan`), two batched matmuls and a softmax, one
  ``index_copy_`` into vLLM's output.  Grouped-query heads are stacked as extra
  query rows instead of K/V being expanded.

On CPU_ATTN the draft rows are attended **once**: vLLM's kernel is handed a
metadata in which those rows form a dummy request over a few keys
(:func:`kernel_metadata`), so it does not attend them over the whole context
first.  A step whose trees are all chains -- one candidate, no window -- runs vLLM's
kernels only; requests without drafts are untouched.

On CUDA the rows are computed by the Triton kernel
(:mod:`vllm_lookahead.kernels.tree_attention`): one launch per layer for every tree
request, reading the paged cache of vLLM's FlashAttention, Triton and FlashInfer backends
in place through the block table, the context split across programs.  The GPU backends'
own kernels still attend every row first (their metadata is not cut) and the tree rows
are then overwritten.  The first tree step of a process runs both the kernel and the
torch pass and stops the engine if they differ (:func:`_check_kernel`);
``VLLM_LOOKAHEAD_TREE_KERNEL=torch`` keeps the torch pass on CUDA, ``=triton`` forces the
kernel (on a CPU, under Triton's interpreter, as tests/kernels runs it).

The replacement of the backend's ``AttentionImpl.forward`` lives in the patch
table (:mod:`vllm_lookahead.engine.hooks.patches`): it runs vLLM's kernel (on CPU with
:func:`kernel_metadata`), then :func:`fix_draft_rows` when the step's
:class:`~vllm_lookahead.engine.step.tree_batch.TreeBatch` (``STEP_CONTEXT.tree_batch()``,
:mod:`vllm_lookahead.engine.hooks.step_context`)
has branching trees.  Everything here is plain functions of the batch, so it is tested
on CPU against a dense reference for every cache layout and against vLLM's own CPU
kernel (tests/unit/test_tree_attention.py, test_gpu_kv_layouts.py), the kernel path
under Triton's interpreter (tests/kernels/test_engine_glue.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from vllm_lookahead.engine.step.kv import RowLayout, row_view
from vllm_lookahead.engine.step.tree_batch import PaddedDraftRows, TreeBatch
from vllm_lookahead.kernels import use_kernel


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


@dataclass(frozen=True)
class _Plan:
    """One step's row indices for the tree pass, for one layer geometry (built by the first
    layer, reused by the others: same block tables, same query/output strides)."""

    q_index: torch.Tensor  # rows of the query row view, (request, kv head, group member, query) order
    out_index: torch.Tensor  # rows of the output row view for the real rows, same order
    real: torch.Tensor | None  # which gathered rows are real (None: no padding)
    k_index: torch.Tensor  # rows of the cache's key rows (K^T on CPU_ATTN)
    v_index: torch.Tensor  # rows of the cache's value rows
    bias: torch.Tensor  # (R, 1, group*Q, keys) additive mask
    kv_heads: int
    group: int

    @classmethod
    def build(
        cls, rows: PaddedDraftRows, layout: RowLayout, heads: int, q_stride: int, out_stride: int, dtype: torch.dtype
    ) -> _Plan:
        R, Q = rows.num_requests, rows.max_queries
        hkv = layout.num_kv_heads
        group = heads // hkv
        dev = rows.query_rows.device
        head = torch.arange(hkv, device=dev).view(1, hkv, 1, 1) * group + torch.arange(group, device=dev).view(
            1, 1, group, 1
        )  # query head of (kv head, member)
        token = rows.query_rows.view(R, 1, 1, Q)
        q_index = (token * q_stride + head).reshape(-1)
        out_index = (token * out_stride + head).reshape(-1)
        real = None
        if rows.padded:
            real_rows = torch.zeros(R * Q, dtype=torch.bool, device=dev)
            real_rows[rows.valid] = True
            real = torch.nonzero(real_rows.view(R, 1, 1, Q).expand(R, hkv, group, Q).reshape(-1)).view(-1)
            out_index = out_index.index_select(0, real)
        k_index, v_index = layout.indices(rows.blocks)
        return cls(q_index, out_index, real, k_index, v_index, rows.additive_mask(group, dtype), hkv, group)


def fix_draft_rows(
    impl: Any, query: torch.Tensor, key: torch.Tensor, kv_cache: torch.Tensor, output: torch.Tensor, batch: TreeBatch
) -> None:
    """Compute the draft rows of ``batch``'s branching trees with the tree mask, into ``output``.

    ``impl`` is the backend's ``AttentionImpl`` (``num_heads``, ``head_size``, ``scale``);
    ``query``/``key``/``output`` are the layer's flattened-batch tensors and ``kv_cache``
    its paged cache, which already holds this step's keys and values.
    """
    if not batch.needs_tree_attention:  # every tree is a chain: vLLM's causal result is exact
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "vllm-lookahead: tree attention is being captured in a CUDA graph; it must run eagerly "
            "(cudagraph_mode PIECEWISE or NONE, see engine/hooks/startup.py)"
        )
    kv = batch.kv
    assert kv is not None
    batch.tree_attention_layers += 1
    if not use_kernel(query):
        _torch_rows(impl, query, key, kv_cache, output, batch)
    elif kv.layout_checked:
        _kernel_rows(impl, query, kv_cache, output, batch)
    else:  # the first tree step of this process: both ways, compared
        _check_kernel(impl, query, key, kv_cache, output, batch)


def _torch_rows(
    impl: Any, query: torch.Tensor, key: torch.Tensor, kv_cache: torch.Tensor, output: torch.Tensor, batch: TreeBatch
) -> None:
    """The torch pass: the CPU path, and the reference of the Triton kernel."""
    kv = batch.kv
    heads, d = impl.num_heads, impl.head_size
    rows = batch.draft_rows
    layout = kv.row_layout(kv_cache)
    q_rows, out_rows = row_view(query, d), row_view(output, d)
    if q_rows is None or out_rows is None:
        raise RuntimeError(
            f"vllm-lookahead: attention query/output strides {query.stride()}/{output.stride()} "
            "cannot be read by head rows; please report the vLLM version and model"
        )
    geometry = (heads, query.stride(0) // d, output.stride(0) // d, layout, kv_cache.dtype)
    plan = rows.plans.get(geometry)
    if plan is None:
        plan = rows.plans[geometry] = _Plan.build(rows, layout, *geometry[:3], kv_cache.dtype)
    R, Q, hkv, group = rows.num_requests, rows.max_queries, plan.kv_heads, plan.group
    keys = rows.num_blocks * rows.block_size
    k = layout.key_rows(kv_cache).index_select(0, plan.k_index)
    k = k.view(R * hkv, d, keys) if layout.keys_transposed else k.view(R * hkv, keys, d).transpose(1, 2)  # K^T
    v = layout.value_rows(kv_cache).index_select(0, plan.v_index).view(R * hkv, keys, d)
    if not kv.layout_checked:
        _check_layout(k.view(R, hkv, d, keys)[0].transpose(1, 2), key, rows.requests[0], kv.backend)
        kv.layout_checked = True
    q = q_rows.index_select(0, plan.q_index).view(R * hkv, group * Q, d).to(k.dtype).mul_(impl.scale)
    scores = torch.bmm(q, k)  # [R*hkv, group*Q, keys]
    scores.view(R, hkv, group * Q, keys).add_(plan.bias)
    o = torch.bmm(torch.softmax(scores, dim=-1), v).view(-1, d)
    if plan.real is not None:
        o = o.index_select(0, plan.real)
    out_rows.index_copy_(0, plan.out_index, o.to(output.dtype))


def by_heads(x: torch.Tensor, heads: int, head_size: int) -> torch.Tensor:
    """``x`` (``[tokens, heads * head_size]`` or ``[tokens, heads, head_size]``, head dimension
    contiguous) as ``[tokens, heads, head_size]`` without a copy."""
    if x.dim() == 3:
        return x
    if x.stride(-1) != 1:
        raise RuntimeError(f"vllm-lookahead: attention tensor strides {x.stride()} cannot be read by heads")
    return torch.as_strided(x, (x.shape[0], heads, head_size), (x.stride(0), head_size, 1))


def _kernel_rows(
    impl: Any, query: torch.Tensor, kv_cache: torch.Tensor, output: torch.Tensor, batch: TreeBatch
) -> None:
    """The draft rows by the Triton kernel (:mod:`vllm_lookahead.kernels.tree_attention`): one
    launch per layer, the paged cache read in place; the launch plan is built by the first layer."""
    from vllm_lookahead.kernels import tree_attention as kernel

    kv, plans = batch.kv, batch.kernel_plans
    heads, d = impl.num_heads, impl.head_size
    addressing = kv.addressing(kv_cache)
    geometry = (heads, addressing, kv_cache.dtype)
    plan = plans.get(geometry)
    if plan is None:
        plan = plans[geometry] = kernel_plan(batch, heads, addressing.num_kv_heads, d, kv_cache.dtype)
    kernel.tree_attention(plan, by_heads(query, heads, d), kv_cache, by_heads(output, heads, d), addressing, impl.scale)


def kernel_plan(batch: TreeBatch, heads: int, num_kv_heads: int, head_size: int, cache_dtype: torch.dtype) -> Any:
    """The step's launch plan of the Triton kernel for one layer geometry
    (:class:`~vllm_lookahead.kernels.tree_attention.TreeAttentionPlan`), built on the host by the
    step's first layer of that geometry."""
    from vllm_lookahead.kernels import tree_attention as kernel

    spans = [
        kernel.TreeRows(
            tr.batch_index,
            tr.token_start + tr.first_branch_node,
            tr.first_branch_node,
            tr.num_nodes,
            tr.context_len,
            None,
            tr.tree.ancestor_words(),
        )
        for tr in batch.branching
    ]
    return kernel.TreeAttentionPlan.build(spans, batch.table(), heads, num_kv_heads, head_size, cache_dtype=cache_dtype)


def _check_kernel(
    impl: Any, query: torch.Tensor, key: torch.Tensor, kv_cache: torch.Tensor, output: torch.Tensor, batch: TreeBatch
) -> None:
    """Once per process: the kernel's rows against the torch pass's (which also checks that the
    cache holds this step's keys where it is read); a disagreement stops the engine."""
    reference = output.clone()
    _torch_rows(impl, query, key, kv_cache, reference, batch)
    _kernel_rows(impl, query, kv_cache, output, batch)
    heads, d = impl.num_heads, impl.head_size
    rows = batch.draft_rows.out_rows
    got = by_heads(output, heads, d).index_select(0, rows).float()
    want = by_heads(reference, heads, d).index_select(0, rows).float()
    tolerance = 1e-4 if output.dtype == torch.float32 else 3e-2
    error = (got - want).abs().max().item()
    if not error <= tolerance * max(1.0, want.abs().max().item()):
        raise RuntimeError(
            f"vllm-lookahead: the Triton tree-attention kernel differs from the torch pass by {error:.3g} on "
            f"backend {batch.kv.backend!r}; set VLLM_LOOKAHEAD_TREE_KERNEL=torch and please report it"
        )


def kernel_metadata(meta: Any, batch: TreeBatch, impl: Any, layer: Any, dtype: torch.dtype) -> Any:
    """CPU_ATTN's metadata for this step with the tree-masked rows taken out of vLLM's kernel.

    Each tree request's rows after its leading chain (computed by :func:`fix_draft_rows`)
    become a request of their own that sees as many keys as it has rows -- a few dot
    products instead of the whole context -- and whose output is overwritten; the root
    and the leading chain keep their causal view (``seq_len`` shortened by the cut rows).
    Built once per step (all layers share one metadata object) and cached on the batch;
    ``meta`` itself is returned when nothing needs cutting or the metadata is not the
    plain causal decoder kind this reasons about.
    """
    cached = batch.kernel_metadata
    if cached is not None and cached[0] is meta:
        return cached[1]
    result = _cut_tree_rows(meta, batch, impl, layer, dtype)
    batch.kernel_metadata = (meta, result)
    return result


def _cut_tree_rows(meta: Any, batch: TreeBatch, impl: Any, layer: Any, dtype: torch.dtype) -> Any:
    if (
        not batch.needs_tree_attention
        or getattr(meta, "dynamic_causal", None) is not None
        or not getattr(meta, "causal", False)
        or getattr(meta, "encoder_cache", None) is not None
    ):
        return meta
    from vllm import _custom_ops as ops
    from vllm import envs

    qsl = meta.query_start_loc.tolist()
    seq = meta.seq_lens.tolist()
    cut = {tr.batch_index: tr for tr in batch.branching}
    starts, lengths, table_rows = [0], [], []
    for i in range(len(seq)):
        tr = cut.get(i)
        if tr is not None:
            kept = tr.first_branch_node
            if qsl[i] != tr.token_start or qsl[i + 1] - qsl[i] != tr.num_nodes:
                return meta  # not the layout the batch was built for: leave vLLM's kernel alone
            starts.append(qsl[i] + kept)
            lengths.append(seq[i] - (tr.num_nodes - kept))
            table_rows.append(i)
        starts.append(qsl[i + 1])
        lengths.append(seq[i] if tr is None else tr.num_nodes - tr.first_branch_node)
        table_rows.append(i)
    dev = meta.query_start_loc.device
    query_start_loc = torch.tensor(starts, dtype=meta.query_start_loc.dtype, device=dev)
    seq_lens = torch.tensor(lengths, dtype=meta.seq_lens.dtype, device=dev)
    block_table = meta.block_table.index_select(0, torch.tensor(table_rows, device=dev))
    scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(lengths),
        num_heads=impl.num_heads,
        num_kv_heads=impl.num_kv_heads,
        head_dim=impl.head_size,
        seq_lens=seq_lens,
        dtype=dtype,
        query_start_loc=query_start_loc,
        causal=True,
        sliding_window_size=impl.sliding_window,
        isa=layer.isa,
        enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
        dynamic_causal=None,
        kv_cache_dtype=impl.kv_cache_dtype,
    )
    q_lens = [b - a for a, b in zip(starts, starts[1:])]
    return dataclasses.replace(
        meta,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_table=block_table,
        scheduler_metadata=scheduler_metadata,
        max_query_len=max(q_lens),
        max_seq_len=max(lengths),
    )


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
