"""Paged KV cache access for tree attention and for compaction of the accepted path.

vLLM's scheduler believes the KV of the first ``a`` draft slots after the root is
valid once ``a`` drafts are accepted (``num_computed_tokens += 1 + a``).  The
accepted path of a tree is not, in general, the first ``a`` rows, so after
verification :func:`move_slots` copies each accepted node's K/V (already
rotated with its tree depth = its final position) from its own slot to slot
``root + depth``.  Everything else the tree wrote is left behind as garbage in
slots vLLM considers free.

vLLM 0.32 hands every attention backend one tensor per layer with the *logical*
shape ``[num_blocks, num_kv_heads, block_size, C]``; its *physical* order is one
of :class:`vllm.v1.kv_cache_layout.KVCacheLayout` (head-major or token-major
blocks, layers outermost or interleaved per block), expressed as strides, so
every view below is built by indexing, never by ``.view`` on the raw storage.
What ``C`` holds depends on the backend:

* ``CPU_ATTN`` (ISAs ``vec``/``vec16``, x86 without AMX): per block and head,
  ``2*head_size*block_size`` values = K transposed (``[head_size, block_size]``)
  then V (``[block_size, head_size]``) -- read off ``ops.cpu_attn_reshape_and_cache``
  (tests/unit/test_kv_layout.py); its only layout is head-major (LBHNC);
* ``FLASH_ATTN``, ``TRITON_ATTN``, ``FLASHINFER``: ``C = 2*head_size``, K in
  ``[..., :head_size]`` and V in ``[..., head_size:]`` of each token's row -- the
  split their own ``do_kv_cache_update`` makes (``kv_cache.transpose(1, 2).split(
  head_size, -1)``), in any KVCacheLayout.  Checked on CPU against vLLM's own
  stride computation for every layout (tests/unit/test_gpu_kv_layouts.py); never
  run on a GPU here.

Either way :func:`kv_views` yields K and V as ``[num_blocks, num_kv_heads,
block_size, head_size]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Backend name (AttentionBackend.get_name()) -> how C splits into K and V.
SPLIT_LAST_DIM = ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER")
SUPPORTED_BACKENDS = ("CPU_ATTN", *SPLIT_LAST_DIM)
# CPU attention kernels whose cache layout is the one read here (AMX/NEON/... pack K differently).
SUPPORTED_CPU_ISAS = ("vec", "vec16")


@dataclass
class PagedKV:
    """The paged KV cache of one worker, as the tree path reads and compacts it."""

    backend: str
    layer_caches: list[torch.Tensor]  # one logical [blocks, kv_heads, block_size, C] tensor per layer
    block_size: int  # tokens per block of the block table the runner hands to attention
    layout_checked: bool = field(default=False)  # set once the first tree step read back its own keys


def kv_views(kv_cache: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V views ``[num_blocks, num_kv_heads, block_size, head_size]`` of one layer's cache."""
    if backend == "CPU_ATTN":
        nb, hkv, bs, two_d = kv_cache.shape
        halves = kv_cache.view(nb, hkv, 2, bs * two_d // 2)
        k = halves[:, :, 0].view(nb, hkv, two_d // 2, bs).transpose(2, 3)
        v = halves[:, :, 1].view(nb, hkv, bs, two_d // 2)
        return k, v
    if backend in SPLIT_LAST_DIM:
        head_size = kv_cache.shape[-1] // 2
        return kv_cache[..., :head_size], kv_cache[..., head_size:]
    raise NotImplementedError(
        f"lookahead tree attention does not know the KV cache layout of attention backend "
        f"{backend!r}; supported: {', '.join(SUPPORTED_BACKENDS)}"
    )


def gather_sequence(view: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` positions of one sequence: ``[num_kv_heads, length, head_size]``."""
    bs = view.shape[2]
    nb = -(-length // bs)
    blocks = view.index_select(0, block_ids[:nb].to(torch.long))  # [nb, H, bs, D]
    return blocks.permute(1, 0, 2, 3).reshape(view.shape[1], nb * bs, view.shape[3])[:, :length]


def gather_blocks(kv_cache: torch.Tensor, backend: str, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the listed blocks, each ``[len(block_ids), num_kv_heads, block_size, head_size]``.

    K and V of a block are one row of the cache tensor's first dimension in every
    layout, so one ``index_select`` fetches both; the results are views into that copy.
    """
    return kv_views(kv_cache.index_select(0, block_ids), backend)


def move_slots(
    kv_caches: list[torch.Tensor], backend: str, src_slots: torch.Tensor, dst_slots: torch.Tensor
) -> None:
    """Copy K/V of ``src_slots`` to ``dst_slots`` in every layer (sources read before writes)."""
    if src_slots.numel() == 0:
        return
    seen: set[int] = set()
    for cache in kv_caches:
        if cache.data_ptr() in seen:  # layers sharing one cache tensor
            continue
        seen.add(cache.data_ptr())
        for view in kv_views(cache, backend):
            bs = view.shape[2]
            sb, so = src_slots // bs, src_slots % bs
            db, do = dst_slots // bs, dst_slots % bs
            rows = view[sb, :, so].clone()  # [m, H, D]
            view[db, :, do] = rows
