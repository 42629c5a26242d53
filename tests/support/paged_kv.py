"""Paged KV caches laid out as vLLM lays them out, and random draft trees, for the tests of the
tree path (torch pass and Triton kernels) on every cache layout the plugin accepts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from vllm_lookahead.core import DraftTree, TreeBuilder
from vllm_lookahead.engine.step.kv import kv_views


def vllm_layer_caches(
    layout, layers: int, blocks: int, block_size: int, kv_heads: int, head_size: int, dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """Per-layer logical ``[blocks, kv_heads, block_size, 2 * head_size]`` views of one buffer,
    strided as vLLM 0.32 lays out the GPU backends' caches in ``layout`` (a ``KVCacheLayout``),
    as its ``create_kv_cache_views`` does."""
    from vllm.v1 import kv_cache_interface as kv_interface

    spec = kv_interface.FullAttentionSpec(
        block_size=block_size, num_kv_heads=kv_heads, head_size=head_size, dtype=dtype
    )
    shape = (layers, *kv_interface.compute_layer_kv_cache_shape_bytes(spec, blocks))
    strides = kv_interface.compute_layout_strides(spec, blocks, layers, layout)
    size = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    raw = torch.zeros(size, dtype=torch.int8)
    view = torch.as_strided(raw, size=shape, stride=strides)
    return [view[layer].view(dtype) for layer in range(layers)]


def cpu_attn_caches(
    layers: int, blocks: int, block_size: int, kv_heads: int, head_size: int, dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """CPU_ATTN's caches (one contiguous tensor per layer: per block and head K^T then V)."""
    return [torch.zeros(blocks, kv_heads, block_size, 2 * head_size, dtype=dtype) for _ in range(layers)]


def write_tokens(cache: torch.Tensor, backend: str, slots: list[int], key: torch.Tensor, value: torch.Tensor) -> None:
    """Write one token's K/V (``[kv_heads, head_size]`` rows of ``key``/``value``) per slot, as the
    backend's cache update does: ``reshape_and_cache_flash`` for the GPU backends (through their
    ``kv_cache.transpose(1, 2).split(head_size, -1)`` views), the K^T / V views on CPU_ATTN."""
    bs = cache.shape[2]
    if backend == "CPU_ATTN":
        k_view, v_view = kv_views(cache, backend)  # [blocks, heads, block_size, head_size]
        for t, slot in enumerate(slots):
            k_view[slot // bs, :, slot % bs] = key[t]
            v_view[slot // bs, :, slot % bs] = value[t]
        return
    key_cache, value_cache = cache.transpose(1, 2).split(cache.shape[-1] // 2, dim=-1)
    for t, slot in enumerate(slots):
        key_cache[slot // bs, slot % bs] = key[t]
        value_cache[slot // bs, slot % bs] = value[t]


def random_tree(rng: np.random.Generator, size: int, chain: bool = False) -> DraftTree:
    """A draft tree of ``size`` nodes: a leading chain, then nodes under random parents
    (``chain``: one chain of ``size`` nodes)."""
    b = TreeBuilder(int(rng.integers(0, 50)))
    if chain:
        b.add_chain(0, rng.integers(0, 50, size=size - 1).tolist(), True)
        return b.build()
    b.add_chain(0, rng.integers(0, 50, size=int(rng.integers(0, size // 2 + 1))).tolist(), True)
    while b.size < size:
        b.add(int(rng.integers(0, b.size)), int(rng.integers(0, 50)), bool(rng.integers(0, 2)))
    return b.build()


def window_tree(rng: np.random.Generator, candidates: int, candidate_len: int, columns: int, levels: int) -> DraftTree:
    """The shape of a full lookahead step: ``candidates`` pool n-grams as chains below the root
    (verification branch), then a Jacobi window of ``columns`` chains of ``levels`` tokens
    (lookahead branch), all hanging off the root."""
    b = TreeBuilder(int(rng.integers(0, 50)))
    for _ in range(candidates):
        b.add_chain(0, rng.integers(0, 50, size=candidate_len).tolist(), True)
    for _ in range(columns):
        b.add_chain(0, rng.integers(0, 50, size=levels).tolist(), False)
    return b.build()


@dataclass
class TreeStep:
    """One decode step of tree requests over a paged cache, with the expected attention output.

    Row 0 of the flattened batch is a plain decode request; each tree request follows (its
    batch index is its block-table row).  ``caches`` hold two layers in one buffer in vLLM's
    layout; ``layer`` is the one written with this step's keys (the other holds negated
    values, so reading the wrong layer shows).  ``expected`` is ``output`` with the tree-masked
    rows replaced by dense attention over the K/V as generated (never read back from a cache).
    """

    requests: list
    block_table: torch.Tensor
    caches: list[torch.Tensor]
    layer: int
    query: torch.Tensor  # [tokens, heads, head_size], a strided view (q of a fused qkv)
    step_keys: torch.Tensor  # [tokens, kv_heads * head_size]: what the backend just wrote
    output: torch.Tensor  # [tokens, heads * head_size], random (rows outside trees stay)
    expected: torch.Tensor  # [tokens, heads, head_size]
    impl: SimpleNamespace  # num_heads, head_size, scale: what the tree path reads of vLLM's impl


def tree_step(
    layout,
    seed: int,
    contexts: tuple[int, ...] = (37, 5, 50),
    blocks: int = 24,
    block_size: int = 16,
    kv_heads: int = 2,
    heads: int = 4,
    head_size: int = 8,
) -> TreeStep:
    """A :class:`TreeStep` on the GPU backends' cache ``layout`` (a ``KVCacheLayout``)."""
    from vllm_lookahead.engine.step.tree_batch import TreeRequest, draft_rows_mask

    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    caches = vllm_layer_caches(layout, 2, blocks, block_size, kv_heads, head_size)
    sizes = [int(rng.integers(3, 12)) for _ in contexts]
    max_blocks = max(-(-(c + n) // block_size) for c, n in zip(contexts, sizes))
    rows = len(contexts) + 1
    block_table = torch.from_numpy(rng.permutation(blocks)[: rows * max_blocks].reshape(rows, max_blocks))
    block_table = block_table.to(torch.int32)
    requests, start = [], 1
    for i, (ctx, n) in enumerate(zip(contexts, sizes)):
        tree = random_tree(rng, n)
        requests.append(TreeRequest(i + 1, f"r{i}", tree, None, start, ctx, tree.logit_rows()))
        start += n
    tokens, layer = start, 1
    step_keys = torch.randn(tokens, kv_heads, head_size, generator=gen)
    query = torch.randn(tokens, (heads + 2 * kv_heads) * head_size, generator=gen)[:, : heads * head_size]
    query = query.view(tokens, heads, head_size)
    output = torch.randn(tokens, heads * head_size, generator=gen)
    expected = output.clone().view(tokens, heads, head_size)
    for tr in requests:
        length = tr.context_len + tr.num_nodes
        k = torch.randn(length, kv_heads, head_size, generator=gen)
        v = torch.randn(length, kv_heads, head_size, generator=gen)
        k[tr.context_len :] = step_keys[tr.token_start : tr.token_start + tr.num_nodes]
        slots = [int(block_table[tr.batch_index, p // block_size]) * block_size + p % block_size for p in range(length)]
        for c in caches:
            sign = 1 if c is caches[layer] else -1
            write_tokens(c, "FLASH_ATTN", slots, sign * k, sign * v)
        q = query[tr.token_start + 1 : tr.token_start + tr.num_nodes].transpose(0, 1)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=draft_rows_mask(tr.tree, tr.context_len),
            scale=1 / math.sqrt(head_size),
            enable_gqa=True,
        )[0].transpose(0, 1)
        first = tr.first_branch_node  # the leading chain keeps vLLM's (causal = tree) result
        expected[tr.token_start + first : tr.token_start + tr.num_nodes] = ref[first - 1 :]
    impl = SimpleNamespace(num_heads=heads, head_size=head_size, scale=1 / math.sqrt(head_size))
    return TreeStep(requests, block_table, caches, layer, query, step_keys.reshape(tokens, -1), output, expected, impl)
