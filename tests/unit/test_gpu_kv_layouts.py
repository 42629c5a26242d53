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
the same layouts; no GPU kernel runs.
"""

from __future__ import annotations

import math
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm_lookahead.core import TreeBuilder
from vllm_lookahead.engine import attention
from vllm_lookahead.engine.kv import SPLIT_LAST_DIM, PagedKV, kv_views, move_slots
from vllm_lookahead.engine.tree_batch import TreeBatch, TreeRequest, draft_rows_mask

kv_interface = pytest.importorskip("vllm.v1.kv_cache_interface")
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

LAYERS, BLOCKS, BS, HKV, HEADS, D = 2, 24, 16, 2, 4, 8


def vllm_layer_caches(layout: KVCacheLayout) -> list[torch.Tensor]:
    """Per-layer logical views of one buffer, strided as vLLM lays out ``layout``."""
    spec = kv_interface.FullAttentionSpec(block_size=BS, num_kv_heads=HKV, head_size=D, dtype=torch.float32)
    shape = (LAYERS, *kv_interface.compute_layer_kv_cache_shape_bytes(spec, BLOCKS))
    strides = kv_interface.compute_layout_strides(spec, BLOCKS, LAYERS, layout)
    size = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    raw = torch.zeros(size, dtype=torch.int8)
    view = torch.as_strided(raw, size=shape, stride=strides)
    return [view[layer].view(torch.float32) for layer in range(LAYERS)]


def write_like_vllm(cache: torch.Tensor, slots: list[int], key: torch.Tensor, value: torch.Tensor) -> None:
    """What ``reshape_and_cache_flash`` does to the backends' K/V views (one token per slot)."""
    key_cache, value_cache = cache.transpose(1, 2).split(D, dim=-1)  # [blocks, block_size, heads, D]
    for t, slot in enumerate(slots):
        key_cache[slot // BS, slot % BS] = key[t]
        value_cache[slot // BS, slot % BS] = value[t]


def random_tree(rng: np.random.Generator, size: int):
    b = TreeBuilder(int(rng.integers(0, 50)))
    b.add_chain(0, rng.integers(0, 50, size=int(rng.integers(0, size // 2 + 1))).tolist(), True)
    while b.size < size:
        b.add(int(rng.integers(0, b.size)), int(rng.integers(0, 50)), bool(rng.integers(0, 2)))
    return b.build()


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda l: l.name)
@pytest.mark.parametrize("backend", SPLIT_LAST_DIM)
def test_tree_attention_on_every_gpu_cache_layout(backend, layout):
    rng = np.random.default_rng(zlib.crc32(f"{backend}/{layout.name}".encode()))
    torch.manual_seed(int(rng.integers(0, 2**31)))
    caches = vllm_layer_caches(layout)
    contexts = [37, 5, 50]
    sizes = [int(rng.integers(3, 12)) for _ in contexts]
    max_blocks = max(-(-(c + n) // BS) for c, n in zip(contexts, sizes))
    block_table = torch.from_numpy(rng.permutation(BLOCKS)[: 4 * max_blocks].reshape(4, max_blocks)).to(torch.int32)

    # Row 0 is a plain decode request; rows 1..3 carry trees (batch index = row of the block table).
    requests, start = [], 1
    for i, (ctx, n) in enumerate(zip(contexts, sizes)):
        tree = random_tree(rng, n)
        requests.append(TreeRequest(i + 1, f"r{i}", tree, None, start, ctx, tree.logit_rows()))
        start += n
    tokens = start
    layer = 1  # the second layer of the shared buffer: its views are offset and, in BL* layouts, interleaved
    seqs = {}
    step_keys = torch.randn(tokens, HKV, D)
    for tr in requests:
        length = tr.context_len + tr.num_nodes
        k, v = torch.randn(length, HKV, D), torch.randn(length, HKV, D)
        k[tr.context_len :] = step_keys[tr.token_start : tr.token_start + tr.num_nodes]  # this step's rows
        slots = [int(block_table[tr.batch_index, p // BS]) * BS + p % BS for p in range(length)]
        for c in caches:  # both layers written, the other one with different values
            write_like_vllm(c, slots, k if c is caches[layer] else -k, v if c is caches[layer] else -v)
        seqs[tr.req_id] = (k, v)

    query = torch.randn(tokens, (HEADS + 2 * HKV) * D)[:, : HEADS * D].view(tokens, HEADS, D)  # q of a qkv split
    out = torch.randn(tokens, HEADS * D)
    expected = out.clone().view(tokens, HEADS, D)
    for tr in requests:
        k, v = seqs[tr.req_id]
        n = tr.num_nodes
        q = query.view(tokens, HEADS, D)[tr.token_start + 1 : tr.token_start + n].transpose(0, 1)
        ref = F.scaled_dot_product_attention(
            q[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=draft_rows_mask(tr.tree, tr.context_len), scale=1 / math.sqrt(D), enable_gqa=True,
        )[0].transpose(0, 1)
        first = tr.first_branch_node  # the leading chain keeps vLLM's (causal = tree) result
        expected[tr.token_start + first : tr.token_start + n] = ref[first - 1 :]

    kv = PagedKV(backend, caches, BS)  # layout not yet checked: the first layer checks it
    batch = TreeBatch(requests, torch.zeros(0), torch.zeros(0), torch.zeros(0), block_table=block_table, kv=kv)
    impl = SimpleNamespace(num_heads=HEADS, head_size=D, scale=1 / math.sqrt(D))
    attention.fix_draft_rows(impl, query, step_keys.reshape(tokens, HKV * D), caches[layer], out, batch)
    assert kv.layout_checked and batch.tree_attention_layers == 1
    torch.testing.assert_close(out.view(tokens, HEADS, D), expected, rtol=1e-5, atol=1e-5)

    # The runtime layout check catches a cache that does not hold this step's keys.
    wrong = PagedKV(backend, caches, BS)
    batch = TreeBatch(requests, torch.zeros(0), torch.zeros(0), torch.zeros(0), block_table=block_table, kv=wrong)
    if batch.needs_tree_attention:
        with pytest.raises(RuntimeError, match="KV cache layout"):
            attention.fix_draft_rows(impl, query, -step_keys.reshape(tokens, HKV * D), caches[layer], out, batch)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda l: l.name)
def test_move_slots_on_every_gpu_cache_layout(layout):
    caches = vllm_layer_caches(layout)
    for c in caches:
        c.copy_(torch.randn_like(c))
    before = [[t.clone() for t in kv_views(c, "FLASH_ATTN")] for c in caches]
    src, dst = torch.tensor([3, 17, 40]), torch.tensor([17, 2, 41])  # 17: destination and source
    move_slots(caches, "FLASH_ATTN", src, dst)
    for c, views_before in zip(caches, before):
        key_cache, value_cache = c.transpose(1, 2).split(D, dim=-1)  # read back as the backends do
        for (view_before, cache_view) in zip(views_before, (key_cache, value_cache)):
            for s, d in zip(src.tolist(), dst.tolist()):
                assert torch.equal(cache_view[d // BS, d % BS], view_before[s // BS, :, s % BS])
            assert torch.equal(cache_view[0, 5], view_before[0, :, 5])  # untouched
