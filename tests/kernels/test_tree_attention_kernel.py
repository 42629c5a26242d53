"""The Triton tree-attention kernel against the dense reference, under Triton's interpreter.

Caches are laid out by vLLM's own stride function for every ``KVCacheLayout`` of the GPU
backends (two layers in one buffer, the second one read) and as CPU_ATTN's K^T/V blocks;
keys and values are written the way the backends write them; block tables are random
permutations.  The reference is dense float32 attention over the K/V as generated, never
read back from the cache.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402  (vLLM's layouts; the kernel imports no vLLM)

from support.paged_kv import cpu_attn_caches, random_tree, vllm_layer_caches, window_tree, write_tokens
from vllm_lookahead.kernels.tree_attention import (
    CacheAddressing,
    TreeAttentionPlan,
    TreeRows,
    ancestor_bits,
    dense_reference,
    tree_attention,
    tree_attention_tiles,
)

TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def run_case(
    seed: int,
    trees: list,
    contexts: list[int],
    *,
    backend: str = "FLASH_ATTN",
    layout=None,
    heads: int = 4,
    kv_heads: int = 2,
    head_size: int = 32,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    every_row: bool = False,
    causal: bool = False,
    **plan_options,
):
    """Lay out ``trees`` (one request each, after a plain row) over ``contexts``, run the kernel
    and return (max error, tolerance, plan)."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    lengths = [c + t.size for c, t in zip(contexts, trees)]
    max_blocks = max(-(-n // block_size) for n in lengths) + 1
    blocks = (len(trees) + 1) * max_blocks + 3
    if backend == "CPU_ATTN":
        cache = cpu_attn_caches(1, blocks, block_size, kv_heads, head_size, dtype)[0]
    else:
        cache = vllm_layer_caches(layout or list(KVCacheLayout)[0], 2, blocks, block_size, kv_heads, head_size, dtype)[
            1
        ]
    table = torch.from_numpy(
        rng.permutation(blocks)[: (len(trees) + 1) * max_blocks].reshape(len(trees) + 1, max_blocks)
    ).to(torch.int32)
    spans, keys, values, row = [], [], [], 1  # row 0: a plain request's token
    for r, (tree, ctx) in enumerate(zip(trees, contexts), start=1):
        n = tree.size
        k = torch.randn(ctx + n, kv_heads, head_size, generator=gen).to(dtype)
        v = torch.randn(ctx + n, kv_heads, head_size, generator=gen).to(dtype)
        slots = [int(table[r, p // block_size]) * block_size + p % block_size for p in range(ctx + n)]
        write_tokens(cache, backend, slots, k, v)
        first = 0 if every_row else _first_branch(tree)
        spans.append(TreeRows(r, row + first, first, n, ctx, tree.ancestor_mask()))
        keys.append(k)
        values.append(v)
        row += n
    # query rows as one slice of a fused qkv projection (a strided view), output with padding columns
    qkv = torch.randn(row, (heads + 2 * kv_heads) * head_size, generator=gen).to(dtype)
    query = qkv[:, : heads * head_size].view(row, heads, head_size)
    output = torch.full((row, heads, head_size + 8), 7.0, dtype=dtype)[..., :head_size]
    scale = 1 / math.sqrt(head_size)
    plan = TreeAttentionPlan.build(
        spans, table, heads, kv_heads, head_size, causal=causal, **{"cache_dtype": dtype, **plan_options}
    )
    tree_attention(plan, query, cache, output, CacheAddressing.of(cache, backend == "CPU_ATTN"), scale)
    expected = dense_reference(query, keys, values, spans, scale, causal=causal)
    error, computed = 0.0, torch.zeros(row, dtype=torch.bool)
    for tr, ref in zip(spans, expected):
        rows = slice(tr.first_row, tr.first_row + tr.num_nodes - tr.first_node)
        computed[rows] = True
        error = max(error, (output[rows].float() - ref).abs().max().item())
    assert torch.all(output[~computed] == 7.0), "rows outside the plan were written"
    return error, TOLERANCE[dtype], plan


def _first_branch(tree) -> int:
    off_chain = np.flatnonzero(tree.parents[1:] != np.arange(tree.size - 1))
    return int(off_chain[0]) + 1 if off_chain.size else tree.size - 1


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda l: l.name)
def test_every_gpu_cache_layout(layout):
    rng = _rng(layout.name)
    trees = [random_tree(rng, 9), window_tree(rng, 3, 4, 4, 3), random_tree(rng, 5)]
    error, tol, _ = run_case(1, trees, [37, 5, 50], layout=layout)
    assert error < tol


def test_cpu_attn_layout():
    rng = _rng("cpu")
    error, tol, _ = run_case(2, [random_tree(rng, 12), random_tree(rng, 7)], [20, 33], backend="CPU_ATTN")
    assert error < tol


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (8, 2), (8, 1)])
def test_grouped_query_heads(heads, kv_heads):
    rng = _rng(f"gqa{heads}/{kv_heads}")
    error, tol, _ = run_case(3, [random_tree(rng, 10), random_tree(rng, 4)], [17, 40], heads=heads, kv_heads=kv_heads)
    assert error < tol


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("head_size", [64, 128, 256, 80])
def test_dtypes_and_head_sizes(dtype, head_size):
    rng = _rng(f"{dtype}/{head_size}")
    error, tol, _ = run_case(
        4,
        [window_tree(rng, 2, 3, 2, 2), random_tree(rng, 6)],
        [30, 3],
        heads=2,
        kv_heads=1,
        head_size=head_size,
        dtype=dtype,
    )
    assert error < tol


@pytest.mark.parametrize("shape", ["chain", "branches", "window"])
def test_tree_shapes_every_row(shape):
    """Every row of the tree computed by the kernel (a chain is then causal attention)."""
    rng = _rng(shape)
    make = {
        "chain": lambda: random_tree(rng, 9, chain=True),
        "branches": lambda: random_tree(rng, 14),
        "window": lambda: window_tree(rng, 4, 5, 5, 4),
    }[shape]
    error, tol, _ = run_case(5, [make(), make()], [11, 29], every_row=True)
    assert error < tol


def test_causal_mode_is_plain_causal_attention():
    rng = _rng("causal")
    error, tol, _ = run_case(6, [random_tree(rng, 12), window_tree(rng, 2, 3, 3, 2)], [25, 8], causal=True)
    assert error < tol


@pytest.mark.parametrize("context", [1, 15, 16, 17, 31, 32, 33, 250])
def test_block_boundaries_and_splits(context):
    """Contexts around block edges (block size 16); at 250 the keys span several splits."""
    rng = _rng(f"ctx{context}")
    trees = [random_tree(rng, 18 - context % 16), random_tree(rng, 3)]  # keys end past the next block edge
    longest = context + trees[0].size
    for splits in (1, 4):
        error, tol, plan = run_case(7, trees, [context, 1], num_splits=splits, block_n=16, min_chunk=16)
        assert error < tol
        assert plan.num_splits == -(-longest // plan.chunk) and (plan.num_splits > 1) == (splits > 1)


def test_split_counters_reset_for_the_next_launch():
    """Splits are combined in the same launch; the counters are back at 0, so a plan serves every layer."""
    rng = _rng("counters")
    _, _, plan = run_case(8, [random_tree(rng, 8)], [100], num_splits=5, block_n=16, min_chunk=16)
    assert plan.num_splits > 1 and plan.counters is not None
    assert int(plan.counters.abs().sum()) == 0


def test_many_rows_span_several_query_tiles():
    rng = _rng("tiles")
    trees = [window_tree(rng, 7, 4, 7, 4), random_tree(rng, 3)]  # 57 nodes x 4 heads per KV head
    error, tol, plan = run_case(9, trees, [40, 2], heads=8, kv_heads=2, block_m=16)
    assert plan.tiles_per_head > 1
    assert error < tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_default_tiles_of_128_rows(dtype):
    """Past 64 rows per KV head (head size <= 128, 16-bit cache) a tile holds 128 rows and 128
    keys, on 8 warps; float32 caches keep 64 x 64 tiles (shared memory)."""
    rng = _rng("tiles128")
    trees = [window_tree(rng, 7, 4, 7, 4), random_tree(rng, 3)]  # 57 nodes x 4 heads per KV head
    error, tol, plan = run_case(11, trees, [40, 2], heads=8, kv_heads=2, dtype=dtype)
    wide = dtype == torch.bfloat16
    assert (plan.block_m, plan.block_n, plan.num_warps, plan.tiles_per_head) == (
        (128, 128, 8, 2) if wide else (64, 64, 4, 4)
    )
    assert error < tol


@pytest.mark.parametrize(
    "rows_m,heads,longest,expected",
    [
        (480, 64, 8257, (256, 64, 3)),  # 64/8 heads, 8k context x 8 requests x 64 drafts: long key loops
        (240, 256, 32833, (256, 64, 2)),  # 32/8, 32k x 32 x 64 drafts
        (480, 8, 8257, (128, 128, 9)),  # one request: 256-row tiles would need 17 short splits
        (240, 256, 577, (128, 128, 1)),  # 512 tokens of context: short key loops
        (128, 64, 8257, (128, 128, 5)),  # 128 rows per KV head fit one 128-row tile
    ],
)
def test_wide_tiles_where_key_loops_are_long(rows_m, heads, longest, expected):
    """256-row tiles only where that plan keeps at most 3 splits of at least 2048 keys (where
    the H100 measured them faster), on 132 SMs (264 programs); 16-bit caches and small trees."""
    assert tree_attention_tiles(rows_m, heads, longest, 128, True, True, 264) == expected
    assert tree_attention_tiles(rows_m, heads, longest, 128, False, True, 264)[0] == 64  # float32 cache
    assert tree_attention_tiles(rows_m, heads, longest, 128, True, False, 264)[0] == 128  # words gathered


def test_plan_picks_256_rows_on_a_long_context():
    """On a CPU (one program, one split) a request past 128 rows per KV head over 2048+ keys gets
    256-row tiles by itself, on 16 warps."""
    rng = _rng("wide-plan")
    trees = [window_tree(rng, 7, 4, 7, 4)]  # 57 nodes x 4 heads per KV head
    error, tol, plan = run_case(14, trees, [2100], heads=8, kv_heads=2, dtype=torch.bfloat16)
    assert (plan.block_m, plan.block_n, plan.num_warps, plan.num_splits) == (256, 64, 16, 1)
    assert error < tol


def test_tiles_of_256_rows():
    """256-row query tiles (the tile sweep's wide setting) over rows of two KV heads' groups."""
    rng = _rng("tiles256")
    trees = [window_tree(rng, 7, 4, 7, 4), random_tree(rng, 3)]  # 57 nodes x 8 heads per KV head
    error, tol, plan = run_case(
        13, trees, [40, 2], heads=16, kv_heads=2, dtype=torch.bfloat16, block_m=256, num_warps=16
    )
    assert (plan.block_m, plan.tiles_per_head, plan.num_warps) == (256, 2, 16)
    assert error < tol


@pytest.mark.parametrize("nodes", [100, 140])
def test_large_trees_words_in_registers_or_gathered(nodes):
    """Up to 128 nodes a row's ancestor words are read once into registers; past that (5 words
    here) they are gathered per key tile: both against the reference."""
    rng = _rng(f"words{nodes}")
    error, tol, plan = run_case(
        12,
        [random_tree(rng, nodes), random_tree(rng, 5)],
        [30, 7],
        heads=2,
        kv_heads=1,
        num_splits=2,
        block_n=32,
        min_chunk=16,
    )
    assert plan.few_words == (nodes <= 128) and plan.bits.shape[-1] == -(-nodes // 32)
    assert error < tol


def test_ancestor_bits_past_one_word():
    rng = _rng("bits")
    tree = random_tree(rng, 70)
    rows = [TreeRows(0, 0, 1, tree.size, 5, tree.ancestor_mask())]
    bits = ancestor_bits(rows, tree.size - 1)
    unpacked = (bits[0][:, :, None] >> np.arange(32)) & 1
    assert np.array_equal(unpacked.reshape(tree.size - 1, -1)[:, : tree.size].astype(bool), tree.ancestor_mask()[1:])


@pytest.mark.parametrize("nodes", [1, 5, 32, 33, 70, 130])
def test_packed_ancestor_rows_are_the_mask(nodes):
    """A tree's ancestor words (made from its parents, as the engine gives the kernel) are its
    mask packed, and requests given by words or by mask get the same bits."""
    from vllm_lookahead.kernels.tree_attention import pack_ancestors

    rng = _rng(f"words {nodes}")
    trees = [random_tree(rng, nodes), random_tree(rng, max(1, nodes // 2))]
    for tree in trees:
        assert np.array_equal(tree.ancestor_words(), pack_ancestors(tree.ancestor_mask()))
    masks = [TreeRows(r, 0, min(1, t.size - 1), t.size, 3, t.ancestor_mask()) for r, t in enumerate(trees)]
    words = [TreeRows(r, 0, min(1, t.size - 1), t.size, 3, None, t.ancestor_words()) for r, t in enumerate(trees)]
    assert all(np.array_equal(w.ancestor_mask(), m.ancestors) for w, m in zip(words, masks))
    assert np.array_equal(ancestor_bits(words, trees[0].size), ancestor_bits(masks, trees[0].size))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    sizes=st.lists(st.integers(2, 24), min_size=1, max_size=3),
    contexts=st.lists(st.integers(1, 90), min_size=3, max_size=3),
    group=st.sampled_from([1, 2, 4]),
    splits=st.integers(1, 4),
    block_size=st.sampled_from([8, 16]),
    gather_words=st.booleans(),
    mask_every_tile=st.booleans(),
)
def test_random_trees_property(seed, sizes, contexts, group, splits, block_size, gather_words, mask_every_tile):
    rng = np.random.default_rng(seed)
    trees = [random_tree(rng, n) for n in sizes]
    error, tol, _ = run_case(
        seed,
        trees,
        contexts[: len(trees)],
        heads=2 * group,
        kv_heads=2,
        head_size=16,
        block_size=block_size,
        num_splits=splits,
        block_n=16,
        min_chunk=8,
        gather_words=gather_words,
        mask_every_tile=mask_every_tile,
    )
    assert error < tol
