"""The KV views and slot moves of engine/step/kv.py against vLLM's own CPU cache-write op."""

import pytest
import torch

from vllm_lookahead.engine.step.kv import gather_sequence, kv_views, move_slots

ops = pytest.importorskip("vllm._custom_ops")


def _write(isa: str, block_size: int, num_blocks=4, heads=2, head_size=64, slots=(0, 5, 33, 70)):
    cache = torch.zeros(num_blocks, heads, block_size, 2 * head_size)
    k_cache, v_cache = cache.view(num_blocks, heads, 2 * block_size, head_size).chunk(2, dim=2)
    key = torch.randn(len(slots), heads, head_size)
    value = torch.randn(len(slots), heads, head_size)
    slot_t = torch.tensor([s % (num_blocks * block_size) for s in slots])
    ops.cpu_attn_reshape_and_cache(
        key, value, k_cache, v_cache, slot_t, isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto"
    )
    return cache, key, value, slot_t


@pytest.mark.parametrize("isa,block_size", [("vec", 32), ("vec16", 16), ("vec16", 32)])
def test_cpu_views_read_what_vllm_writes(isa, block_size):
    cache, key, value, slots = _write(isa, block_size)
    k, v = kv_views(cache, "CPU_ATTN")
    for t, s in enumerate(slots.tolist()):
        assert torch.equal(k[s // block_size, :, s % block_size], key[t])
        assert torch.equal(v[s // block_size, :, s % block_size], value[t])


def test_gather_sequence_follows_block_table():
    block_size = 32
    cache, key, value, _ = _write("vec", block_size, slots=(0,))
    k, _ = kv_views(cache, "CPU_ATTN")
    k.copy_(torch.randn_like(k))
    blocks = torch.tensor([2, 0, 3])
    seq = gather_sequence(k, blocks, 70)
    assert seq.shape == (2, 70, 64)
    for pos in (0, 31, 32, 69):
        b = blocks[pos // block_size]
        assert torch.equal(seq[:, pos], k[b, :, pos % block_size])


@pytest.mark.parametrize("backend", ["CPU_ATTN", "FLASH_ATTN"])
def test_move_slots_reads_all_sources_before_writing(backend):
    torch.manual_seed(0)
    cache = torch.randn(4, 2, 32, 128) if backend == "CPU_ATTN" else torch.randn(2, 4, 32, 2, 64)
    before = [t.clone() for t in kv_views(cache.clone(), backend)]
    # Overlapping: 3 -> 1 and 1 -> 2 (slot 1 is both a destination and a source).
    src, dst = torch.tensor([3, 1, 40]), torch.tensor([1, 2, 33])
    move_slots([cache, cache], backend, src, dst)
    after = kv_views(cache, backend)
    for view_before, view_after in zip(before, after):
        for s, d in zip(src.tolist(), dst.tolist()):
            assert torch.equal(view_after[d // 32, :, d % 32], view_before[s // 32, :, s % 32])
        untouched = 5
        assert torch.equal(view_after[0, :, untouched], view_before[0, :, untouched])
