"""Tree attention and KV compaction on the cache layouts of vLLM's GPU backends, run on the CPU.

vLLM 0.32 hands FlashAttention, Triton and FlashInfer one tensor per layer with the logical
shape ``[blocks, kv_heads, block_size, 2*head_size]`` (K | V in the last dimension) in one of
six physical orders (``KVCacheLayout``).  The caches here are laid out by vLLM's own stride
function (``compute_layout_strides``, as ``create_kv_cache_views`` does, two layers sharing
one buffer); the step's keys and values are written the way those backends'
``do_kv_cache_update`` does (``kv_cache.transpose(1, 2).split(head_size, -1)``, slot ->
``(slot // block_size, slot % block_size)``); block tables are random permutations.  The
reference is dense attention over the K/V as generated -- never read back from the cache --
with the tree mask.  This is as close to the GPU path as a CPU gets: the same torch code,
the same layouts (the Triton kernels on these layouts: tests/kernels).
"""

from __future__ import annotations

import zlib

import pytest
import torch
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from support.paged_kv import tree_step, vllm_layer_caches
from vllm_lookahead.engine.step import attention
from vllm_lookahead.engine.step.kv import SPLIT_LAST_DIM, PagedKV, kv_views, move_slots
from vllm_lookahead.engine.step.tree_batch import TreeBatch

LAYERS, BLOCKS, BS, HKV, D = 2, 24, 16, 2, 8


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda l: l.name)
@pytest.mark.parametrize("backend", SPLIT_LAST_DIM)
def test_tree_attention_on_every_gpu_cache_layout(backend, layout):
    step = tree_step(layout, zlib.crc32(f"{backend}/{layout.name}".encode()))
    tokens = step.query.shape[0]
    out = step.output.clone()
    kv = PagedKV(backend, step.caches, BS)  # layout not yet checked: the first layer checks it
    batch = TreeBatch(
        step.requests, torch.zeros(0), torch.zeros(0), torch.zeros(0), block_table=step.block_table, kv=kv
    )
    cache = step.caches[step.layer]
    attention.fix_draft_rows(step.impl, step.query, step.step_keys, cache, out, batch)
    assert kv.layout_checked and batch.tree_attention_layers == 1
    torch.testing.assert_close(out.view(step.expected.shape), step.expected, rtol=1e-5, atol=1e-5)

    # The runtime layout check catches a cache that does not hold this step's keys.
    wrong = PagedKV(backend, step.caches, BS)
    batch = TreeBatch(
        step.requests, torch.zeros(0), torch.zeros(0), torch.zeros(0), block_table=step.block_table, kv=wrong
    )
    if batch.needs_tree_attention:
        with pytest.raises(RuntimeError, match="KV cache layout"):
            attention.fix_draft_rows(step.impl, step.query, -step.step_keys, cache, out.view(tokens, -1), batch)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda l: l.name)
def test_move_slots_on_every_gpu_cache_layout(layout):
    caches = vllm_layer_caches(layout, LAYERS, BLOCKS, BS, HKV, D)
    for c in caches:
        c.copy_(torch.randn_like(c))
    before = [[t.clone() for t in kv_views(c, "FLASH_ATTN")] for c in caches]
    src, dst = torch.tensor([3, 17, 40]), torch.tensor([17, 2, 41])  # 17: destination and source
    move_slots(caches, "FLASH_ATTN", src, dst)
    for c, views_before in zip(caches, before):
        key_cache, value_cache = c.transpose(1, 2).split(D, dim=-1)  # read back as the backends do
        for view_before, cache_view in zip(views_before, (key_cache, value_cache)):
            for s, d in zip(src.tolist(), dst.tolist()):
                assert torch.equal(cache_view[d // BS, d % BS], view_before[s // BS, :, s % BS])
            assert torch.equal(cache_view[0, 5], view_before[0, :, 5])  # untouched
