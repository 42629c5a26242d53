"""Tree-masked attention over vLLM's paged KV cache: one Triton launch per layer.

A lookahead step runs, per request, the root (last accepted token) and its draft tree in
one forward (Fu et al., 2024, arXiv:2402.02057, Sec. 3.3, Fig. 4): a draft node attends to
the whole context and to its own ancestors in the tree, nothing else.  vLLM 0.32's
attention kernels know causal masks only, so the rows that need the tree mask -- every node
from the tree's first branch on (the root and the leading chain keep vLLM's causal result,
which equals their tree view) -- are computed here, for every tree request of the step in
one launch::

    out[row] = softmax(q_row K^T * scale, over context + ancestors(row)) V

* **Paged KV read in place.**  Keys and values are read through the request's block table
  from the cache tensor vLLM hands the layer (logical ``[blocks, kv_heads, block_size, C]``,
  any physical order, described by :class:`CacheAddressing`), never gathered into a copy.
* **Programs.**  One program per (request, KV head, tile of ``BLOCK_M`` query rows) and per
  *split* of the request's keys.  Query heads that share a KV head are stacked as rows of
  the same tile (grouped-query attention reads each key tile once for the whole group).
* **Online softmax** over key tiles of ``BLOCK_N`` positions; the context part needs no
  mask (its whole tiles are read with no bounds and their scores taken as they are; only the
  context's last, partial tile is masked), the tree part (the step's own nodes) reads each
  row's ancestor bits.  The block size is a compile-time constant (a shift, not a division).
* **Flash-decoding split.**  A request's keys are cut into ``num_splits`` chunks handled by
  separate programs, so one request at 32k tokens still fills the GPU.  Each split writes
  its partial (max, sum, accumulator); the *last* split of a tile to finish (an atomic
  counter per tile) combines them and writes the output, then resets the counter for the
  next layer -- the combine lives in the same launch, and the launch needs no zeroing
  before it (counters are zeroed once when a plan's workspace is made).

Which rows: only the tree-masked rows are computed here.  vLLM's own kernel still runs over
every row on the GPU backends (their metadata is not cut as on CPU_ATTN), so the context of
a tree request is read twice per layer: once by vLLM's kernel for all its rows, once here for
the tree-masked ones.  The alternative -- every row of tree requests here and those requests
taken out of vLLM's metadata -- would need the FlashAttention / FlashInfer metadata rebuilt
per step (cu_seqlens, scheduler metadata, plans); the GPU check measures what the second
read costs against plain attention of the same rows (benchmarks/gpu/check.py).

CUDA graphs: a plan's shapes (requests, rows, splits) change every step, so the launch is not
captured; it runs eagerly between vLLM's piecewise CUDA-graph pieces (attention is a
splitting op there).  FULL graphs stay refused (engine/hooks/startup.py).  The launch itself does
no host synchronisation: everything it needs is built on the host from the tree batch.

Checked on the CPU under Triton's interpreter against a dense reference (tests/kernels/) and
on a GPU by ``python -m benchmarks.gpu.check``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
WIDE_MAX_SPLITS = 3  # 256-row tiles: at most this many splits of a request's keys ...
WIDE_MIN_KEYS = 2048  # ... each of at least this many keys (H100, docs/bench/2026-11-26-gpu-check-2)


@dataclass(frozen=True)
class CacheAddressing:
    """Where element ``d`` of the key / value of (block ``b``, KV head ``h``, slot ``s``) lies in
    one layer's cache, in elements from the cache tensor's first element::

        K: b * block_stride + h * head_stride + s * k_slot_stride + d * k_dim_stride
        V: b * block_stride + h * head_stride + v_offset + s * v_slot_stride + d * v_dim_stride

    The GPU backends (FLASH_ATTN, TRITON_ATTN, FLASHINFER) keep a token's K then V in the last
    dimension of the logical ``[blocks, kv_heads, block_size, 2 * head_size]`` tensor; CPU_ATTN
    keeps per block and head K transposed (``[head_size, block_size]``) then V.
    """

    block_stride: int
    head_stride: int
    k_slot_stride: int
    k_dim_stride: int
    v_offset: int
    v_slot_stride: int
    v_dim_stride: int
    head_size: int
    block_size: int
    num_kv_heads: int

    @classmethod
    def of(cls, kv_cache: torch.Tensor, keys_transposed: bool = False) -> CacheAddressing:
        """The addressing of a layer's logical cache tensor; ``keys_transposed`` for CPU_ATTN."""
        nb, hkv, bs, c = kv_cache.shape
        d = c // 2
        s_block, s_head, s_slot, s_last = kv_cache.stride()
        if s_last != 1:
            raise ValueError(f"KV cache strides {kv_cache.stride()}: the last dimension must be contiguous")
        if keys_transposed:
            if s_slot != c:
                raise ValueError(f"CPU_ATTN cache strides {kv_cache.stride()}: a block's head must be one run")
            return cls(s_block, s_head, 1, bs, bs * d, d, 1, d, bs, hkv)
        return cls(s_block, s_head, s_slot, 1, d, s_slot, 1, d, bs, hkv)


@dataclass(frozen=True)
class TreeRows:
    """One tree request's rows for the kernel.

    ``first_row`` is the flattened-batch row of node ``first_node``, the first row computed
    here; rows ``first_node .. num_nodes - 1`` are computed.  Keys: ``context_len`` positions
    of context, then the tree's ``num_nodes`` nodes (the step's own K/V, already in the cache).
    ``ancestors`` is the tree's ``(num_nodes, num_nodes)`` bool mask (a node is its own ancestor),
    or None where ``words`` gives it packed as :func:`pack_ancestors` packs it.
    """

    table_row: int
    first_row: int
    first_node: int
    num_nodes: int
    context_len: int
    ancestors: np.ndarray | None
    words: np.ndarray | None = None

    def ancestor_mask(self) -> np.ndarray:
        """The bool ``(num_nodes, num_nodes)`` mask, given or unpacked from ``words``."""
        if self.ancestors is not None:
            return self.ancestors
        assert self.words is not None
        bits = (self.words[:, :, None] >> np.arange(32, dtype=np.int32)) & 1
        return bits.reshape(self.num_nodes, -1)[:, : self.num_nodes].astype(bool)


def pack_ancestors(mask: np.ndarray) -> np.ndarray:
    """int32 ``(n, ceil(n / 32))``: bit ``j % 32`` of word ``j // 32`` of row ``i`` set iff ``mask[i, j]``."""
    n = mask.shape[0]
    words = max(1, -(-n // 32))
    bits = np.zeros((n, words * 32), dtype=np.uint8)
    bits[:, :n] = mask
    packed = np.packbits(bits.reshape(n, words, 4, 8), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed.reshape(n, words, 4)).view("<i4")[..., 0]


def ancestor_bits(rows: list[TreeRows], max_queries: int) -> np.ndarray:
    """int32 ``[R, max_queries, words]``: bit ``j % 32`` of word ``j // 32`` of computed row ``i``
    of request ``r`` is set iff node ``j`` is an ancestor of (or is) node ``first_node + i``."""
    words = max(1, -(-max(tr.num_nodes for tr in rows) // 32))
    bits = np.zeros((len(rows), max_queries, words), dtype=np.int32)
    for r, tr in enumerate(rows):
        packed = tr.words if tr.words is not None else pack_ancestors(tr.ancestor_mask())
        bits[r, : tr.num_nodes - tr.first_node, : packed.shape[1]] = packed[tr.first_node : tr.num_nodes]
    return bits


@dataclass
class TreeAttentionPlan:
    """One step's launch of :func:`tree_attention` for one layer geometry, built on the host once
    and shared by every layer of that geometry (same block table, same trees)."""

    meta: torch.Tensor  # int32 [R, 5]: first_row, computed rows, context_len, first_node, table_row
    bits: torch.Tensor  # int32 [R, max_queries, words]: ancestor bits (ancestor_bits)
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]: vLLM's table (rows addressed by table_row)
    num_requests: int
    max_queries: int
    num_kv_heads: int
    group: int  # query heads per KV head
    head_size: int
    block_m: int
    block_n: int
    tiles_per_head: int  # query tiles per (request, KV head)
    num_splits: int
    chunk: int  # keys per split (a multiple of block_n)
    causal: bool  # plain causal mask over the tree's node order (the baseline of the GPU check)
    few_words: bool  # trees of <= 128 nodes: each row's ancestor words read once into registers,
    #                           else gathered per key tile
    num_warps: int  # by the query tile (tile_warps): 4, 8, or 16 for 256 rows (registers)
    num_stages: int  # software pipelining depth of the key loop (Triton's default, 3)
    mask_every_tile: bool  # bounds and score masks on every key tile, not only on the context's last
    #                           one and the tree's (the GPU check's comparison)
    counters: torch.Tensor | None  # int32 [tiles]: splits finished per tile (0 between launches)
    part_out: torch.Tensor | None  # float32 [tiles, splits, block_m, block_d]
    part_stats: torch.Tensor | None  # float32 [tiles, splits, 2, block_m]: running max (log2 units), sum

    @property
    def block_d(self) -> int:
        return triton.next_power_of_2(self.head_size)

    @property
    def grid(self) -> tuple[int, int]:
        return (self.num_requests * self.num_kv_heads * self.tiles_per_head, self.num_splits)

    @classmethod
    def build(
        cls,
        rows: list[TreeRows],
        block_table: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        *,
        causal: bool = False,
        num_splits: int | None = None,
        block_m: int | None = None,
        block_n: int | None = None,
        min_chunk: int = 256,
        gather_words: bool = False,
        num_warps: int | None = None,
        num_stages: int = 3,
        mask_every_tile: bool = False,
        cache_dtype: torch.dtype | None = None,
    ) -> TreeAttentionPlan:
        """``num_splits`` None: enough splits to give every SM about two programs (one split on a
        CPU), never chunks under ``min_chunk`` keys.  ``block_m`` None: the smallest of 16 / 32 /
        64 / 128 rows that holds a request's rows per KV head (128 only up to head size 128 and
        over a 16-bit ``cache_dtype``), so a key tile is read by as few query tiles as registers
        and shared memory allow; past 128 rows per KV head, 256 rows on 16 warps where that plan
        still has long key loops (at most ``WIDE_MAX_SPLITS`` splits of at least ``WIDE_MIN_KEYS``
        keys: with more or shorter splits the combine of the wide partials and the lost programs
        cost more than the wide tiles save).  ``block_n`` None: 64 keys per tile, 128 with 128-row
        tiles of a tree up to 128 nodes (the gathered ancestor words of larger trees would take the
        shared memory past an A100's), 32 past head size 128.  benchmarks/gpu/tile_sweep.py and the GPU
        check's side-by-side columns measured these on an H100 (docs/bench/).  ``gather_words``:
        read the ancestor words per key tile even for small trees; ``mask_every_tile``: bounds and
        masks on every key tile (both the GPU check's comparisons)."""
        if not rows:
            raise ValueError("a tree-attention plan needs at least one request")
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} KV heads")
        dev = block_table.device
        group = num_heads // num_kv_heads
        R = len(rows)
        Q = max(tr.num_nodes - tr.first_node for tr in rows)
        if min(tr.num_nodes - tr.first_node for tr in rows) < 1:
            raise ValueError("every request of a plan must have a row to compute")
        rows_m = Q * group
        few_words = not gather_words and max(tr.num_nodes for tr in rows) <= 128
        longest = max(tr.context_len + tr.num_nodes for tr in rows)
        programs = 2 * torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
        bm, bn, num_splits = tree_attention_tiles(
            rows_m,
            R * num_kv_heads,
            longest,
            head_size,
            cache_dtype is not None and cache_dtype.itemsize <= 2,
            few_words,
            programs,
            block_m=block_m,
            block_n=block_n,
            num_splits=num_splits,
            min_chunk=min_chunk,
        )
        tiles_per_head = -(-rows_m // bm)
        tiles = R * num_kv_heads * tiles_per_head
        per_split = -(-longest // num_splits)
        chunk = -(-per_split // bn) * bn
        num_splits = -(-longest // chunk)
        meta = np.array(
            [[tr.first_row, tr.num_nodes - tr.first_node, tr.context_len, tr.first_node, tr.table_row] for tr in rows],
            dtype=np.int32,
        )
        bits = ancestor_bits(rows, Q)
        counters = part_out = part_stats = None
        if num_splits > 1:
            bd = triton.next_power_of_2(head_size)
            counters = torch.zeros(tiles, dtype=torch.int32, device=dev)
            part_out = torch.empty((tiles, num_splits, bm, bd), dtype=torch.float32, device=dev)
            part_stats = torch.empty((tiles, num_splits, 2, bm), dtype=torch.float32, device=dev)
        return cls(
            torch.from_numpy(meta).to(dev),
            torch.from_numpy(bits).to(dev),
            block_table,
            R,
            Q,
            num_kv_heads,
            group,
            head_size,
            bm,
            bn,
            tiles_per_head,
            num_splits,
            chunk,
            causal,
            few_words,
            num_warps or tile_warps(bm, head_size),
            num_stages,
            mask_every_tile,
            counters,
            part_out,
            part_stats,
        )


def tree_attention_tiles(
    rows_m: int,
    heads: int,
    longest: int,
    head_size: int,
    sixteen_bit: bool,
    few_words: bool,
    programs: int,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_splits: int | None = None,
    min_chunk: int = 256,
) -> tuple[int, int, int]:
    """(rows per query tile, keys per key tile, splits) of a launch whose requests have up to
    ``rows_m`` rows per KV head (query heads of a group stacked), ``heads`` (request, KV head)
    pairs, up to ``longest`` keys, aiming at ``programs`` programs (see
    :meth:`TreeAttentionPlan.build`; given values are kept)."""

    def splits_for(tiles: int) -> int:
        return num_splits or max(1, min(-(-programs // tiles), -(-longest // min_chunk)))

    bm = block_m or (
        16 if rows_m <= 16 else 32 if rows_m <= 32 else 128 if rows_m > 64 and head_size <= 128 and sixteen_bit else 64
    )
    if block_m is None and bm == 128 and rows_m > 128 and few_words:
        wide_splits = splits_for(heads * -(-rows_m // 256))
        if wide_splits <= WIDE_MAX_SPLITS and longest >= WIDE_MIN_KEYS * wide_splits:
            bm = 256
    bn = block_n or (32 if head_size > 128 else 128 if bm == 128 and few_words and sixteen_bit else 64)
    return bm, bn, splits_for(heads * -(-rows_m // bm))


def tile_warps(block_m: int, head_size: int) -> int:
    """Warps of a program by its query tile (registers): 4 up to 64 rows x 128 dimensions, 16 for
    256 rows, else 8."""
    return 16 if block_m == 256 else 4 if head_size <= 128 and block_m <= 64 else 8


def tree_attention(
    plan: TreeAttentionPlan,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
    addressing: CacheAddressing,
    scale: float,
) -> None:
    """Write the plan's rows of ``output`` (``[tokens, num_heads, head_size]``, any token/head
    strides, head dimension contiguous) from ``query`` (same shape) and the layer's paged
    ``kv_cache`` (already holding this step's keys and values)."""
    if query.stride(-1) != 1 or output.stride(-1) != 1:
        raise ValueError("tree attention needs the head dimension of query and output contiguous")
    if addressing.head_size != plan.head_size or addressing.num_kv_heads != plan.num_kv_heads:
        raise ValueError("the plan was built for another layer geometry")
    split = plan.num_splits > 1
    dummy = plan.meta  # unused pointer arguments when there is one split
    _tree_attention_kernel[plan.grid](
        query,
        kv_cache,
        output,
        plan.block_table,
        plan.meta,
        plan.bits,
        plan.part_out if split else dummy,
        plan.part_stats if split else dummy,
        plan.counters if split else dummy,
        scale * LOG2E,
        query.stride(0),
        query.stride(1),
        output.stride(0),
        output.stride(1),
        addressing.block_stride,
        addressing.head_stride,
        addressing.k_slot_stride,
        addressing.k_dim_stride,
        addressing.v_offset,
        addressing.v_slot_stride,
        addressing.v_dim_stride,
        plan.block_table.stride(0),
        plan.num_kv_heads,
        plan.tiles_per_head,
        plan.chunk,
        plan.max_queries,
        plan.bits.shape[-1],
        plan.num_splits,
        PAGE=addressing.block_size,
        GROUP=plan.group,
        HEAD_DIM=plan.head_size,
        BLOCK_D=plan.block_d,
        BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n,
        SPLIT=split,
        CAUSAL=plan.causal,
        DOT_IEEE=_float32_dots(kv_cache.dtype),
        FEW_WORDS=plan.few_words,
        MASK_ALL=plan.mask_every_tile,
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
    )


def _float32_dots(dtype: torch.dtype) -> bool:
    """Whether the kernel's two matmuls run in IEEE float32: for float32 caches (no TF32 rounding),
    and for bfloat16 under Triton's interpreter, whose ``tl.dot`` on bfloat16 operands is wrong
    (triton 3.6: it multiplies their raw bits) -- the operands are then rounded to bfloat16
    exactly as on the GPU and multiplied in float32."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _attend(
    q,
    acc,
    m_i,
    l_i,
    start,
    k_hi,
    ctx,
    first,
    qi,
    row_ok,
    r,
    h,
    CACHE,
    BLOCK_TABLE,
    BITS,
    scale_log2,
    c_block,
    c_head,
    k_slot,
    k_dim,
    v_off,
    v_slot,
    v_dim,
    bt_row,
    max_q,
    words,
    w0,
    w1,
    w2,
    w3,
    PAGE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TREE: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_IEEE: tl.constexpr,
    FEW_WORDS: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One key tile: positions ``start .. start + BLOCK_N`` (those below ``k_hi``) into the
    running (max, sum, accumulator) of the tile's query rows.  ``MASKED`` False: a context tile
    wholly below ``k_hi`` -- no bounds on its loads and no mask on its scores."""
    pos = start + tl.arange(0, BLOCK_N)
    pos_ok = pos < k_hi
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    k_ptr = (d * k_dim)[:, None]
    v_ptr = (d * v_dim)[None, :]
    if MASKED:
        block = tl.load(BLOCK_TABLE + bt_row + pos // PAGE, mask=pos_ok, other=0).to(tl.int64)
    else:
        block = tl.load(BLOCK_TABLE + bt_row + pos // PAGE).to(tl.int64)
    slot = (pos % PAGE).to(tl.int64)
    base = block * c_block + h * c_head
    k_ptr = CACHE + (base + slot * k_slot)[None, :] + k_ptr  # K^T [BLOCK_D, BLOCK_N]
    v_ptr = CACHE + v_off + (base + slot * v_slot)[:, None] + v_ptr  # V [BLOCK_N, BLOCK_D]
    if MASKED or HEAD_DIM != BLOCK_D:
        kt = tl.load(k_ptr, mask=pos_ok[None, :] & d_ok[:, None], other=0.0)
    else:
        kt = tl.load(k_ptr)
    if DOT_IEEE:
        s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    s = s * scale_log2
    if TREE:
        node = pos - ctx  # the step's own keys: node ids of the tree
        if CAUSAL:
            visible = node[None, :] <= (first + qi)[:, None]
        else:
            node_c = tl.maximum(node, 0)
            if FEW_WORDS:  # the row's words are in registers: pick one per key
                wi = (node_c // 32)[None, :]
                word = tl.where(
                    wi == 0, w0[:, None], tl.where(wi == 1, w1[:, None], tl.where(wi == 2, w2[:, None], w3[:, None]))
                )
            else:
                word = tl.load(
                    BITS + ((r * max_q + qi) * words)[:, None] + (node_c // 32)[None, :],
                    mask=row_ok[:, None] & pos_ok[None, :],
                    other=0,
                )
            visible = ((word >> (node_c % 32)[None, :]) & 1) != 0
        s = tl.where(visible & pos_ok[None, :], s, float("-inf"))
    elif MASKED:
        s = tl.where(pos_ok[None, :] & (qi >= 0)[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet stay at 0
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    if MASKED or HEAD_DIM != BLOCK_D:
        v = tl.load(v_ptr, mask=pos_ok[:, None] & d_ok[None, :], other=0.0)
    else:
        v = tl.load(v_ptr)
    if DOT_IEEE:
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    l_i = l_i * alpha + tl.sum(p, 1)
    return acc, m_new, l_i


@triton.jit
def _tree_attention_kernel(
    Q,
    CACHE,
    OUT,
    BLOCK_TABLE,
    META,
    BITS,
    PART_OUT,
    PART_STATS,
    COUNTERS,
    scale_log2,
    q_tok,
    q_head,
    o_tok,
    o_head,
    c_block,
    c_head,
    k_slot,
    k_dim,
    v_off,
    v_slot,
    v_dim,
    bt_stride,
    num_kv_heads,
    tiles_per_head,
    chunk,
    max_q,
    words,
    num_splits,
    PAGE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_IEEE: tl.constexpr,
    FEW_WORDS: tl.constexpr,
    MASK_ALL: tl.constexpr,
):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    r = tile // (num_kv_heads * tiles_per_head)
    h = (tile // tiles_per_head) % num_kv_heads
    mt = tile % tiles_per_head
    first_row = tl.load(META + r * 5)
    num_q = tl.load(META + r * 5 + 1)
    ctx = tl.load(META + r * 5 + 2)
    first = tl.load(META + r * 5 + 3)
    table_row = tl.load(META + r * 5 + 4)
    if mt * BLOCK_M >= num_q * GROUP:  # a padding tile of this request: every split leaves
        return
    m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = m < num_q * GROUP
    qi = m // GROUP
    head = h * GROUP + m % GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    row = (first_row + qi).to(tl.int64)
    q = tl.load(
        Q + (row * q_tok + head * q_head)[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0
    )
    q = q.to(CACHE.dtype.element_ty)
    seq_len = ctx + first + num_q  # context, then the tree's nodes 0 .. first + num_q - 1
    k_lo = split * chunk
    k_hi = tl.minimum(k_lo + chunk, seq_len)
    bt_row = table_row.to(tl.int64) * bt_stride
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    ctx_hi = tl.minimum(k_hi, ctx)
    w0 = tl.zeros((BLOCK_M,), tl.int32)
    w1 = w0
    w2 = w0
    w3 = w0
    if FEW_WORDS:  # the rows' ancestor words, read once
        w_row = BITS + (r * max_q + qi) * words
        w0 = tl.load(w_row, mask=row_ok, other=0)
        w1 = tl.load(w_row + 1, mask=row_ok & (words > 1), other=0)
        w2 = tl.load(w_row + 2, mask=row_ok & (words > 2), other=0)
        w3 = tl.load(w_row + 3, mask=row_ok & (words > 3), other=0)
    full_hi = k_lo + tl.maximum(ctx_hi - k_lo, 0) // BLOCK_N * BLOCK_N
    for start in range(k_lo, full_hi, BLOCK_N):  # whole tiles of context keys: visible to every row
        acc, m_i, l_i = _attend(
            q,
            acc,
            m_i,
            l_i,
            start,
            ctx_hi,
            ctx,
            first,
            qi,
            row_ok,
            r,
            h,
            CACHE,
            BLOCK_TABLE,
            BITS,
            scale_log2,
            c_block,
            c_head,
            k_slot,
            k_dim,
            v_off,
            v_slot,
            v_dim,
            bt_row,
            max_q,
            words,
            w0,
            w1,
            w2,
            w3,
            PAGE,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            False,
            CAUSAL,
            DOT_IEEE,
            FEW_WORDS,
            MASK_ALL,
        )
    for start in range(full_hi, ctx_hi, BLOCK_N):  # the context's last, partial tile
        acc, m_i, l_i = _attend(
            q,
            acc,
            m_i,
            l_i,
            start,
            ctx_hi,
            ctx,
            first,
            qi,
            row_ok,
            r,
            h,
            CACHE,
            BLOCK_TABLE,
            BITS,
            scale_log2,
            c_block,
            c_head,
            k_slot,
            k_dim,
            v_off,
            v_slot,
            v_dim,
            bt_row,
            max_q,
            words,
            w0,
            w1,
            w2,
            w3,
            PAGE,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            False,
            CAUSAL,
            DOT_IEEE,
            FEW_WORDS,
            True,
        )
    for start in range(tl.maximum(k_lo, ctx), k_hi, BLOCK_N):  # the step's nodes: the tree mask
        acc, m_i, l_i = _attend(
            q,
            acc,
            m_i,
            l_i,
            start,
            k_hi,
            ctx,
            first,
            qi,
            row_ok,
            r,
            h,
            CACHE,
            BLOCK_TABLE,
            BITS,
            scale_log2,
            c_block,
            c_head,
            k_slot,
            k_dim,
            v_off,
            v_slot,
            v_dim,
            bt_row,
            max_q,
            words,
            w0,
            w1,
            w2,
            w3,
            PAGE,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            True,
            CAUSAL,
            DOT_IEEE,
            FEW_WORDS,
            True,
        )
    out_ptr = OUT + (row * o_tok + head * o_head)[:, None] + d[None, :]
    out_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        slot_id = tile * num_splits + split
        tl.store(PART_OUT + (slot_id * BLOCK_M + tl.arange(0, BLOCK_M))[:, None] * BLOCK_D + d[None, :], acc)
        stats = PART_STATS + slot_id * 2 * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(stats, m_i)
        tl.store(stats + BLOCK_M, l_i)
        tl.debug_barrier()  # every thread's partial is stored before the counter moves
        done = tl.atomic_add(COUNTERS + tile, 1, sem="acq_rel")
        if done == num_splits - 1:  # the last split of this tile combines them all
            m_all = tl.full((BLOCK_M,), float("-inf"), tl.float32)
            for s in range(num_splits):
                m_s = tl.load(
                    PART_STATS + (tile * num_splits + s) * 2 * BLOCK_M + tl.arange(0, BLOCK_M), cache_modifier=".cg"
                )
                m_all = tl.maximum(m_all, m_s)
            m_ref = tl.where(m_all == float("-inf"), 0.0, m_all)
            total = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
            l_all = tl.zeros((BLOCK_M,), tl.float32)
            for s in range(num_splits):
                sid = tile * num_splits + s
                m_s = tl.load(PART_STATS + sid * 2 * BLOCK_M + tl.arange(0, BLOCK_M), cache_modifier=".cg")
                l_s = tl.load(PART_STATS + sid * 2 * BLOCK_M + BLOCK_M + tl.arange(0, BLOCK_M), cache_modifier=".cg")
                o_s = tl.load(
                    PART_OUT + (sid * BLOCK_M + tl.arange(0, BLOCK_M))[:, None] * BLOCK_D + d[None, :],
                    cache_modifier=".cg",
                )
                w = tl.exp2(m_s - m_ref)
                total += o_s * w[:, None]
                l_all += l_s * w
            l_all = tl.where(l_all == 0.0, 1.0, l_all)
            tl.store(out_ptr, (total / l_all[:, None]).to(OUT.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(COUNTERS + tile, 0)  # ready for the next layer's launch
    else:
        l_i = tl.where(l_i == 0.0, 1.0, l_i)
        tl.store(out_ptr, (acc / l_i[:, None]).to(OUT.dtype.element_ty), mask=out_mask)


def dense_reference(
    query: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    rows: list[TreeRows],
    scale: float,
    causal: bool = False,
) -> list[torch.Tensor]:
    """The plan's rows computed densely in float32 from each request's K/V as generated
    (``keys[r]``/``values[r]``: ``[context_len + num_nodes, kv_heads, head_size]``): per request
    ``[computed rows, num_heads, head_size]``.  The reference of the tests and the GPU check."""
    out = []
    heads = query.shape[1]
    for tr, k, v in zip(rows, keys, values):
        q = query[tr.first_row : tr.first_row + tr.num_nodes - tr.first_node].float()  # [q, H, D]
        group = heads // k.shape[1]
        kf = k.float().repeat_interleave(group, dim=1)
        vf = v.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, kf) * scale
        n = tr.num_nodes
        nodes = np.arange(tr.first_node, n)
        visible = np.ones((len(nodes), tr.context_len + n), dtype=bool)
        if causal:
            visible[:, tr.context_len :] = np.arange(n)[None, :] <= nodes[:, None]
        else:
            visible[:, tr.context_len :] = tr.ancestor_mask()[tr.first_node : n]
        mask = torch.from_numpy(visible).to(scores.device)
        scores = scores.masked_fill(~mask[None], float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), vf))
    return out


def num_programs(plan: TreeAttentionPlan) -> int:
    """Programs of one launch (for reports)."""
    return math.prod(plan.grid)
