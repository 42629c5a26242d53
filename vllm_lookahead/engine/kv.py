"""Paged KV cache access for tree attention and for compaction of the accepted path.

vLLM's scheduler believes the KV of the first ``a`` draft slots after the root is
valid once ``a`` drafts are accepted (``num_computed_tokens += 1 + a``).  The
accepted path of a tree is not, in general, the first ``a`` rows, so after
verification :func:`move_slots` copies each accepted node's K/V (already
rotated with its tree depth = its final position) from its own slot to slot
``root + depth``.  Everything else the tree wrote is left behind as garbage in
slots vLLM considers free.

Two cache layouts are known, each exposed as per-layer K and V views shaped
``[num_blocks, num_kv_heads, block_size, head_size]``:

* ``CPU_ATTN`` (vLLM CPU backend, ISAs ``vec``/``vec16``, i.e. x86 without AMX):
  ``[num_blocks, num_kv_heads, block_size, 2*head_size]`` storing, per block and
  head, K transposed (``[head_size, block_size]``) followed by V (``[block_size, head_size]``)
  -- measured with ``ops.cpu_attn_reshape_and_cache`` (tests/unit/test_kv_layout.py);
* ``FLASH_ATTN`` (and other NHD backends): ``[2, num_blocks, block_size, num_kv_heads, head_size]``
  -- not exercised on this CPU-only project's CI.
"""

from __future__ import annotations

import torch

SUPPORTED_BACKENDS = ("CPU_ATTN", "FLASH_ATTN", "TRITON_ATTN")
# CPU attention kernels whose cache layout is the one read here (AMX/NEON/... pack K differently).
SUPPORTED_CPU_ISAS = ("vec", "vec16")


def kv_views(kv_cache: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V views ``[num_blocks, num_kv_heads, block_size, head_size]`` of one layer's cache."""
    if backend == "CPU_ATTN":
        nb, hkv, bs, two_d = kv_cache.shape
        halves = kv_cache.view(nb, hkv, 2, bs * two_d // 2)
        k = halves[:, :, 0].view(nb, hkv, two_d // 2, bs).transpose(2, 3)
        v = halves[:, :, 1].view(nb, hkv, bs, two_d // 2)
        return k, v
    if backend in ("FLASH_ATTN", "TRITON_ATTN"):
        if kv_cache.shape[0] == 2:
            k, v = kv_cache.unbind(0)
        else:  # [num_blocks, 2, block_size, num_kv_heads, head_size]
            k, v = kv_cache.unbind(1)
        return k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
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

    On the CPU layout K and V of a block are adjacent, so one ``index_select``
    fetches both; the result is a view into that one copy.
    """
    if backend == "CPU_ATTN":
        return kv_views(kv_cache.index_select(0, block_ids), backend)
    k, v = kv_views(kv_cache, backend)
    return k.index_select(0, block_ids), v.index_select(0, block_ids)


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
