"""Micro-benchmark: the tree pass per layer vs vLLM's CPU kernel, SmolLM2-135M shapes (2026-11-25).

    .venv/bin/python docs/bench/2026-11-25-attention/attention_microbench.py 128 500   # block size, context

Per tree shape (lead chain + window columns): the pass's time per layer, and vLLM's kernel over all
of a tree request's rows vs over its root + leading chain only (what it runs since commit 8ac2985).
"""
import time, sys
import numpy as np, torch
from types import SimpleNamespace
from vllm import _custom_ops as ops
from vllm_lookahead.core import TreeBuilder
from vllm_lookahead.engine import attention
from vllm_lookahead.engine.kv import PagedKV
from vllm_lookahead.engine.tree_batch import TreeBatch, TreeRequest

torch.manual_seed(0)
heads, hkv, d, bs = 9, 3, 64, int(sys.argv[1]) if len(sys.argv) > 1 else 128
ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 500
num_blocks = 64
cache = torch.randn(num_blocks, hkv, bs, 2 * d)

def tree_of(lead, wcols, levels=4):
    b = TreeBuilder(1)
    b.add_chain(0, list(range(2, 2 + lead)), True)
    # window: level0 chain of wcols from root, then levels hanging
    prev = 0; l0 = []
    for c in range(wcols):
        prev = b.add(prev, 100 + c, False); l0.append(prev)
    for c in range(wcols):
        p = l0[c]
        for lv in range(1, levels):
            p = b.add(p, 200 + lv * 10 + c, lv == levels - 1)
    return b.build()

def run(lead, wcols, reps=200):
    tree = tree_of(lead, wcols)
    n = tree.size
    tr = TreeRequest(0, "r", tree, None, 0, ctx, tree.logit_rows())
    block_table = torch.arange(num_blocks, dtype=torch.int32).view(1, -1)
    kv = PagedKV("CPU_ATTN", [cache], bs, layout_checked=True)
    q = torch.randn(n, heads * d); out = torch.zeros(n, heads * d)
    impl = SimpleNamespace(num_heads=heads, head_size=d, scale=0.125)
    batch = TreeBatch([tr], torch.zeros(0), torch.zeros(0), torch.zeros(0), block_table=block_table, kv=kv)
    rows = 0
    if batch.needs_tree_attention:
        batch.draft_rows  # built once per step
        rows = n - tr.first_branch_node
        for _ in range(10): attention.fix_draft_rows(impl, q, None, cache, out, batch)
        t = time.perf_counter()
        for _ in range(reps): attention.fix_draft_rows(impl, q, None, cache, out, batch)
        ours = (time.perf_counter() - t) / reps
    else:
        ours = 0.0
    # vLLM kernel over all n rows vs over the first-branch prefix
    def kernel(nq):
        kc, vc = cache.view(num_blocks, hkv, bs * 2, -1).chunk(2, dim=2)
        qsl = torch.tensor([0, nq], dtype=torch.int32); sl = torch.tensor([ctx + nq], dtype=torch.int32)
        meta = ops.cpu_attn_get_scheduler_metadata(num_reqs=1, num_heads=heads, num_kv_heads=hkv, head_dim=d,
            seq_lens=sl, dtype=torch.float32, query_start_loc=qsl, causal=True, sliding_window_size=-1,
            isa="vec", enable_kv_split=False, kv_cache_dtype="auto")
        qq = torch.randn(nq, heads, d); oo = torch.zeros(nq, heads, d)
        def call():
            ops.cpu_attention_with_kv_cache(query=qq, key_cache=kc, value_cache=vc, output=oo, query_start_loc=qsl,
                seq_lens=sl, scale=0.125, causal=True, alibi_slopes=None, sliding_window=-1, block_table=block_table,
                softcap=0, scheduler_metadata=meta, s_aux=None, dynamic_causal=None, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
        for _ in range(10): call()
        t = time.perf_counter()
        for _ in range(reps): call()
        return (time.perf_counter() - t) / reps
    k_all = kernel(n); k_pre = kernel(max(1, tr.first_branch_node))
    print(f"bs={bs} ctx={ctx} lead={lead} wcols={wcols} nodes={n} recomputed={rows}: ours {ours*1e6:.0f} us/layer "
          f"(x30 = {ours*30e3:.2f} ms), vLLM kernel all rows {k_all*1e6:.0f} us, prefix rows {k_pre*1e6:.0f} us")

torch.set_num_threads(2)
for lead, w in [(4, 0), (4, 1), (4, 2), (0, 2), (8, 3), (16, 7), (30, 7)]:
    run(lead, w)
