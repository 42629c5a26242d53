"""The one-launch KV compaction kernel against the torch reference (``engine.kv.move_slots``),
bit for bit, on every cache layout, with moves as verification lists them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from support.paged_kv import cpu_attn_caches, vllm_layer_caches
from vllm_lookahead.engine.step.kv import PagedKV
from vllm_lookahead.engine.step.kv import move_slots as torch_move_slots
from vllm_lookahead.kernels.kv_compaction import layer_offsets, move_slots
from vllm_lookahead.kernels.tree_attention import CacheAddressing

LAYERS, BLOCKS, BS, HKV, D = 3, 12, 8, 2, 16


def accepted_path_moves(rng: np.random.Generator, requests: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot moves of ``requests`` trees, each ``root + node -> root + depth`` for an accepted
    path of increasing nodes (what verification emits), request by request."""
    src, dst, root = [], [], 3
    for _ in range(requests):
        size = int(rng.integers(2, 12))
        path = np.sort(rng.choice(np.arange(1, size), size=int(rng.integers(1, size)), replace=False))
        for depth, node in enumerate(path.tolist(), start=1):
            if node != depth:
                src.append(root + node)
                dst.append(root + depth)
        root += size + int(rng.integers(0, 5))
    return torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)


def check(caches: list[torch.Tensor], backend: str, src: torch.Tensor, dst: torch.Tensor, block_moves: int) -> None:
    for c in caches:
        c.copy_(torch.randn_like(c))
    expected = [c.clone() for c in caches]
    torch_move_slots(expected, backend, src, dst)
    move_slots(
        caches[0],
        layer_offsets(caches),
        CacheAddressing.of(caches[0], backend == "CPU_ATTN"),
        src,
        dst,
        block_moves=block_moves,
    )
    for got, want in zip(caches, expected):
        assert torch.equal(got, want)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda l: l.name)
def test_every_gpu_cache_layout(layout):
    rng = np.random.default_rng(len(layout.name))
    src, dst = accepted_path_moves(rng, 4)
    check(vllm_layer_caches(layout, LAYERS, BLOCKS, BS, HKV, D), "FLASH_ATTN", src, dst, block_moves=4)


def test_cpu_attn_layout_and_separate_allocations():
    src, dst = accepted_path_moves(np.random.default_rng(1), 3)
    check(cpu_attn_caches(LAYERS, BLOCKS, BS, HKV, D), "CPU_ATTN", src, dst, block_moves=2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_bits_survive(dtype):
    src, dst = accepted_path_moves(np.random.default_rng(2), 2)
    caches = [torch.zeros(BLOCKS, HKV, BS, 2 * D, dtype=dtype) for _ in range(2)]
    check(caches, "FLASH_ATTN", src, dst, block_moves=16)


def test_paged_kv_uses_the_kernel_when_asked(monkeypatch):
    """``PagedKV.move`` (what verification calls) takes the one-launch path under
    ``VLLM_LOOKAHEAD_TREE_KERNEL=triton`` and the torch path otherwise; both agree."""
    src, dst = accepted_path_moves(np.random.default_rng(3), 3)
    caches = vllm_layer_caches(list(KVCacheLayout)[3], LAYERS, BLOCKS, BS, HKV, D)
    for c in caches:
        c.copy_(torch.randn_like(c))
    twin = [c.clone() for c in caches]
    calls = []
    import vllm_lookahead.kernels.kv_compaction as compaction

    monkeypatch.setattr(compaction, "move_slots", lambda *a, **k: calls.append(1) or move_slots(*a, **k))
    monkeypatch.setenv("VLLM_LOOKAHEAD_TREE_KERNEL", "triton")
    PagedKV("FLASH_ATTN", caches, BS).move(src, dst)
    monkeypatch.setenv("VLLM_LOOKAHEAD_TREE_KERNEL", "torch")
    PagedKV("FLASH_ATTN", twin, BS).move(src, dst)
    assert calls == [1]
    assert all(torch.equal(a, b) for a, b in zip(caches, twin))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), requests=st.integers(1, 6), block_moves=st.sampled_from([1, 2, 4, 16]))
def test_moves_in_any_chunking_property(seed, requests, block_moves):
    src, dst = accepted_path_moves(np.random.default_rng(seed), requests)
    check(
        vllm_layer_caches(list(KVCacheLayout)[seed % 6], 2, BLOCKS * 4, BS, HKV, D), "FLASH_ATTN", src, dst, block_moves
    )
