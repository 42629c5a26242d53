"""The engine's use of the kernels: ``attention.fix_draft_rows`` (what the patched attention
forward calls per layer) with the Triton kernel chosen, as on CUDA, here forced with
``VLLM_LOOKAHEAD_TREE_KERNEL=triton``; its first tree step compares the kernel with the torch
pass and stops the engine on a difference."""

from __future__ import annotations

import zlib

import pytest
import torch
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from support.paged_kv import tree_step
from vllm_lookahead.engine.step import attention
from vllm_lookahead.engine.step.kv import SPLIT_LAST_DIM, PagedKV
from vllm_lookahead.engine.step.tree_batch import TreeBatch
from vllm_lookahead.kernels import tree_attention as kernel

BS = 16


def batch_of(step, kv: PagedKV) -> TreeBatch:
    return TreeBatch(step.requests, torch.zeros(0), torch.zeros(0), torch.zeros(0), block_table=step.block_table, kv=kv)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda l: l.name)
@pytest.mark.parametrize("backend", SPLIT_LAST_DIM)
def test_fix_draft_rows_runs_the_kernel(monkeypatch, backend, layout):
    monkeypatch.setenv("VLLM_LOOKAHEAD_TREE_KERNEL", "triton")
    launches = []
    real = kernel.tree_attention
    monkeypatch.setattr(kernel, "tree_attention", lambda *a: launches.append(1) or real(*a))
    step = tree_step(layout, zlib.crc32(f"glue/{backend}/{layout.name}".encode()))
    kv = PagedKV(backend, step.caches, BS)
    cache = step.caches[step.layer]
    for _ in range(2):  # first step: kernel checked against the torch pass; second: the kernel alone
        out = step.output.clone()
        batch = batch_of(step, kv)
        attention.fix_draft_rows(step.impl, step.query, step.step_keys, cache, out, batch)
        assert kv.layout_checked
        torch.testing.assert_close(out.view(step.expected.shape), step.expected, rtol=1e-5, atol=1e-5)
    expected_launches = 2 if batch.needs_tree_attention else 0
    assert len(launches) == expected_launches  # one launch per layer call
    assert "draft_rows" not in vars(batch)  # the kernel alone never lays out the torch pass's padded rows


def test_a_kernel_that_disagrees_stops_the_first_tree_step(monkeypatch):
    monkeypatch.setenv("VLLM_LOOKAHEAD_TREE_KERNEL", "triton")
    step = next(
        s
        for seed in range(20)
        if (s := tree_step(list(KVCacheLayout)[0], seed))
        and batch_of(s, PagedKV("FLASH_ATTN", s.caches, BS)).needs_tree_attention
    )

    def wrong(plan, query, kv_cache, output, addressing, scale):
        output.zero_()

    monkeypatch.setattr(kernel, "tree_attention", wrong)
    batch = batch_of(step, PagedKV("FLASH_ATTN", step.caches, BS))
    with pytest.raises(RuntimeError, match="Triton tree-attention kernel differs"):
        attention.fix_draft_rows(
            step.impl, step.query, step.step_keys, step.caches[step.layer], step.output.clone(), batch
        )


def test_torch_pass_when_asked(monkeypatch):
    monkeypatch.setenv("VLLM_LOOKAHEAD_TREE_KERNEL", "torch")
    monkeypatch.setattr(kernel, "tree_attention", lambda *a: pytest.fail("the kernel ran"))
    step = tree_step(list(KVCacheLayout)[2], 3)
    out = step.output.clone()
    attention.fix_draft_rows(
        step.impl,
        step.query,
        step.step_keys,
        step.caches[step.layer],
        out,
        batch_of(step, PagedKV("FLASH_ATTN", step.caches, BS)),
    )
    torch.testing.assert_close(out.view(step.expected.shape), step.expected, rtol=1e-5, atol=1e-5)
