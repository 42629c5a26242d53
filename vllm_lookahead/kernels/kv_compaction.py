"""KV compaction of the accepted path, every layer in one Triton launch.

After verification the accepted path's keys and values must sit in the slots vLLM believes
hold them: accepted node ``i`` at depth ``k`` of a request's tree moves from slot
``root + i`` to slot ``root + k`` (:mod:`vllm_lookahead.engine.step.verification`).  One program per
(layer, KV head) copies every move of the step, for all requests, in chunks of ``BLOCK_MOVES``:
each chunk's sources are loaded before any of its destinations is written (a barrier between),
and chunks go in the order given.  That order is safe when each request's moves come by
ascending depth, as verify_step lists them: a move's source (node ``i >= k``) is never the
destination of an earlier move of the same request (depths ``< k``), and a later chunk never
reads what an earlier one wrote.

Layers are addressed as element offsets from the first layer's cache (``layer_offsets``):
vLLM's GPU layers are views of one or a few buffers; the offsets may be negative or span
allocations (one flat address space on the device).  The host builds the offsets once per
engine; a step passes two int64 slot tensors that stay on the device -- no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_lookahead.kernels.tree_attention import CacheAddressing


def layer_offsets(caches: list[torch.Tensor]) -> torch.Tensor:
    """int64 element offsets of every distinct layer cache from the first one (on its device);
    caches must share dtype, shape and strides (one :class:`CacheAddressing`)."""
    first = caches[0]
    size = first.element_size()
    seen, offsets = set(), []
    for cache in caches:
        if cache.data_ptr() in seen:  # layers sharing one cache tensor
            continue
        if cache.dtype != first.dtype or cache.shape != first.shape or cache.stride() != first.stride():
            raise ValueError("KV compaction in one launch needs every layer's cache alike")
        seen.add(cache.data_ptr())
        delta = cache.data_ptr() - first.data_ptr()
        if delta % size:
            raise ValueError("layer caches are not aligned to their element size")
        offsets.append(delta // size)
    return torch.tensor(offsets, dtype=torch.int64, device=first.device)


def move_slots(
    first_cache: torch.Tensor,
    offsets: torch.Tensor,
    addressing: CacheAddressing,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    block_moves: int = 16,
) -> None:
    """Copy K/V of ``src_slots`` to ``dst_slots`` (int64, same device) in every layer of
    ``offsets`` (:func:`layer_offsets`), in one launch."""
    n = src_slots.numel()
    if n == 0:
        return
    grid = (offsets.numel() * addressing.num_kv_heads,)
    _move_slots_kernel[grid](
        first_cache,
        offsets,
        src_slots,
        dst_slots,
        n,
        addressing.block_stride,
        addressing.head_stride,
        addressing.k_slot_stride,
        addressing.k_dim_stride,
        addressing.v_offset,
        addressing.v_slot_stride,
        addressing.v_dim_stride,
        addressing.block_size,
        addressing.num_kv_heads,
        HEAD_DIM=addressing.head_size,
        BLOCK_D=triton.next_power_of_2(addressing.head_size),
        BLOCK_MOVES=block_moves,
    )


@triton.jit
def _move_slots_kernel(
    CACHE,
    OFFSETS,
    SRC,
    DST,
    n_moves,
    c_block,
    c_head,
    k_slot,
    k_dim,
    v_off,
    v_slot,
    v_dim,
    page,
    num_kv_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_MOVES: tl.constexpr,
):
    pid = tl.program_id(0)
    layer = pid // num_kv_heads
    h = pid % num_kv_heads
    base = CACHE + tl.load(OFFSETS + layer) + h * c_head
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    for start in range(0, n_moves, BLOCK_MOVES):
        i = start + tl.arange(0, BLOCK_MOVES)
        ok = i < n_moves
        src = tl.load(SRC + i, mask=ok, other=0)
        dst = tl.load(DST + i, mask=ok, other=0)
        mask = ok[:, None] & d_ok[None, :]
        src_at = (src // page) * c_block + (src % page) * k_slot
        dst_at = (dst // page) * c_block + (dst % page) * k_slot
        src_v = (src // page) * c_block + (src % page) * v_slot + v_off
        dst_v = (dst // page) * c_block + (dst % page) * v_slot + v_off
        k = tl.load(base + src_at[:, None] + (d * k_dim)[None, :], mask=mask)
        v = tl.load(base + src_v[:, None] + (d * v_dim)[None, :], mask=mask)
        tl.debug_barrier()  # every source of the chunk read before any destination is written
        tl.store(base + dst_at[:, None] + (d * k_dim)[None, :], k, mask=mask)
        tl.store(base + dst_v[:, None] + (d * v_dim)[None, :], v, mask=mask)
        tl.debug_barrier()  # and written before the next chunk reads
