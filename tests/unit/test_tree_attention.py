"""Batched draft-row attention (engine/step/attention.py) against a per-request reference.

The reference is the definition: each draft row attends, with plain SDPA, to
the request's whole context plus its tree ancestors, read from the paged cache
one request at a time.  The batched path pads all tree requests into one call.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm_lookahead.core import TreeBuilder
from vllm_lookahead.engine.step import attention
from vllm_lookahead.engine.step.kv import PagedKV, gather_sequence, kv_views
from vllm_lookahead.engine.step.tree_batch import TreeBatch, TreeRequest, draft_rows_mask


def _random_tree(rng, size):
    b = TreeBuilder(int(rng.integers(0, 50)))
    b.add_chain(0, rng.integers(0, 50, size=int(rng.integers(0, size))).tolist(), True)  # a leading chain
    while b.size < size:
        b.add(int(rng.integers(0, b.size)), int(rng.integers(0, 50)), bool(rng.integers(0, 2)))
    return b.build()


@pytest.mark.parametrize("backend", ["CPU_ATTN", "FLASH_ATTN"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_tree_attention_matches_per_request_reference(backend, seed):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    heads, hkv, d, bs, num_blocks = 6, 2, 16, 16, 40
    if backend == "CPU_ATTN":
        cache = torch.randn(num_blocks, hkv, bs, 2 * d)
    else:
        cache = torch.randn(num_blocks, hkv, bs, 2 * d)  # vLLM 0.32: K and V split the last dim
    # Batch: a plain decode row, then three tree requests of different context and tree sizes.
    contexts, sizes = [37, 5, 100], [int(rng.integers(2, 12)) for _ in range(3)]
    perm = torch.from_numpy(rng.permutation(num_blocks))
    block_table = perm[: 4 * 9].view(4, 9).to(torch.int32)
    requests, start = [], 1
    for i, (ctx, n) in enumerate(zip(contexts, sizes)):
        tree = _random_tree(rng, n)
        tr = TreeRequest(i + 1, f"r{i}", tree, None, start, ctx, tree.logit_rows())
        requests.append(tr)
        start += n
    tokens = start
    query = torch.randn(tokens, heads * d)
    out = torch.randn(tokens, heads * d)
    k_view, v_view = kv_views(cache, backend)

    def attend(tr, mask):  # rows 1..n-1 of one request over its cached sequence
        n, length = tr.num_nodes, tr.context_len + tr.num_nodes
        k = gather_sequence(k_view, block_table[tr.batch_index], length)
        v = gather_sequence(v_view, block_table[tr.batch_index], length)
        q = query.view(tokens, heads, d)[tr.token_start + 1 : tr.token_start + n].transpose(0, 1)
        o = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=0.3, enable_gqa=True)[0]
        return o.transpose(0, 1)

    # What vLLM's causal kernel left in the output: exact only for a leading chain.
    for tr in requests:
        n = tr.num_nodes
        causal = torch.ones(n - 1, tr.context_len + n, dtype=torch.bool).tril(tr.context_len + 1)
        out.view(tokens, heads, d)[tr.token_start + 1 : tr.token_start + n] = attend(tr, causal)
    kv = PagedKV(backend, [cache], bs, layout_checked=True)
    batch = TreeBatch(requests, torch.zeros(0), torch.zeros(0), torch.zeros(0), block_table=block_table, kv=kv)
    impl = SimpleNamespace(num_heads=heads, head_size=d, scale=0.3)

    expected = out.clone().view(tokens, heads, d)
    for tr in requests:
        expected[tr.token_start + 1 : tr.token_start + tr.num_nodes] = attend(
            tr, draft_rows_mask(tr.tree, tr.context_len)
        )

    attention.fix_draft_rows(impl, query, None, cache, out, batch)
    assert batch.tree_attention_layers == 1
    torch.testing.assert_close(out.view(tokens, heads, d), expected, rtol=1e-5, atol=1e-5)
    # roots and the plain row are untouched
    untouched = [0] + [tr.token_start for tr in requests]
    torch.testing.assert_close(out.view(tokens, heads, d)[untouched], expected[untouched])


def test_chains_need_no_recomputation():
    chain = TreeBuilder(1)
    chain.add_chain(0, [2, 3, 4], True)
    tree = chain.build()
    tr = TreeRequest(0, "r", tree, None, 0, 10, tree.logit_rows())
    assert tr.first_branch_node == 4
    batch = TreeBatch(
        [tr],
        torch.zeros(0),
        torch.zeros(0),
        torch.zeros(0),
        block_table=torch.zeros(1, 4, dtype=torch.int32),
        kv=PagedKV("CPU_ATTN", [], 16),
    )
    assert not batch.needs_tree_attention
    assert batch.draft_rows is None
    branched = TreeBuilder(1)
    branched.add_chain(0, [2, 3], True)
    branched.add_chain(0, [5], True)
    assert TreeRequest(0, "r", branched.build(), None, 0, 10, np.zeros(0)).first_branch_node == 3


def test_vllm_cpu_kernel_with_tree_rows_cut_plus_the_pass_is_tree_attention():
    """The CPU path as the engine runs it: vLLM's own kernel on a metadata with the tree-masked
    rows cut out (:func:`attention.kernel_metadata`), then the pass; every row of the batch --
    a plain decode row, a prefill chunk, roots, leading chains, branches -- equals dense
    attention with the tree mask.  The query is a strided view, as in a model (q of a qkv split)."""
    ops = pytest.importorskip("vllm._custom_ops")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata

    rng = np.random.default_rng(7)
    torch.manual_seed(7)
    heads, hkv, d, bs, num_blocks = 6, 2, 64, 32, 48
    cache = torch.zeros(num_blocks, hkv, bs, 2 * d)
    k_cache, v_cache = cache.view(num_blocks, hkv, 2 * bs, d).chunk(2, dim=2)
    # (context, step rows, tree or None): plain decode, tree, prefill chunk, tree, tree (chain only)
    chain = TreeBuilder(3)
    chain.add_chain(0, [4, 5], True)
    specs = [
        (40, 1, None),
        (70, 0, _random_tree(rng, 9)),
        (0, 20, None),
        (33, 0, _random_tree(rng, 12)),
        (5, 0, chain.build()),
    ]
    table = torch.from_numpy(rng.permutation(num_blocks)[: 5 * 6].reshape(5, 6)).to(torch.int32)
    requests, starts, seq_lens, seqs, start = [], [0], [], [], 0
    for i, (ctx, rows, tree) in enumerate(specs):
        n = tree.size if tree is not None else rows
        length = ctx + n
        k, v = torch.randn(length, hkv, d), torch.randn(length, hkv, d)
        slots = torch.tensor([int(table[i, p // bs]) * bs + p % bs for p in range(length)])
        ops.cpu_attn_reshape_and_cache(
            k, v, k_cache, v_cache, slots, "vec", k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto"
        )
        if tree is not None:
            requests.append(TreeRequest(i, f"r{i}", tree, None, start, ctx, tree.logit_rows()))
        seqs.append((ctx, n, tree, k, v))
        start += n
        starts.append(start)
        seq_lens.append(length)
    tokens = start
    qkv = torch.randn(tokens, (heads + 2 * hkv) * d)
    query = qkv[:, : heads * d].view(tokens, heads, d)  # strided, like the model's q as vLLM's layer passes it
    key = qkv[:, heads * d : (heads + hkv) * d].view(tokens, hkv, d)
    for (ctx, n, _, k, _), s in zip(seqs, starts):
        key[s : s + n] = k[ctx:]  # the step's keys, as written to the cache
    scale = d**-0.5
    qsl = torch.tensor(starts, dtype=torch.int32)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    sched = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(specs),
        num_heads=heads,
        num_kv_heads=hkv,
        head_dim=d,
        seq_lens=sl,
        dtype=torch.float32,
        query_start_loc=qsl,
        causal=True,
        sliding_window_size=-1,
        isa="vec",
        enable_kv_split=False,
    )
    meta = CPUAttentionMetadata(
        num_actual_tokens=tokens,
        max_query_len=20,
        query_start_loc=qsl,
        max_seq_len=max(seq_lens),
        seq_lens=sl,
        block_table=table,
        slot_mapping=torch.zeros(tokens, dtype=torch.long),
        scheduler_metadata=sched,
    )
    impl = SimpleNamespace(
        num_heads=heads, num_kv_heads=hkv, head_size=d, scale=scale, sliding_window=-1, kv_cache_dtype="auto"
    )
    kv = PagedKV("CPU_ATTN", [cache], bs)
    batch = TreeBatch(requests, torch.zeros(0), torch.zeros(0), torch.zeros(0), block_table=table, kv=kv)
    cut = attention.kernel_metadata(meta, batch, impl, SimpleNamespace(isa="vec"), torch.float32)
    assert cut is not meta and attention.kernel_metadata(meta, batch, impl, None, torch.float32) is cut  # once per step
    assert cut.seq_lens.tolist()[:3] == [
        41,
        70 + requests[0].first_branch_node,
        requests[0].num_nodes - requests[0].first_branch_node,
    ]

    out = torch.full((tokens, heads, d), float("nan"))
    ops.cpu_attention_with_kv_cache(
        query=query,
        key_cache=k_cache,
        value_cache=v_cache,
        output=out,
        query_start_loc=cut.query_start_loc,
        seq_lens=cut.seq_lens,
        scale=scale,
        causal=True,
        alibi_slopes=None,
        sliding_window=-1,
        block_table=cut.block_table,
        softcap=0,
        scheduler_metadata=cut.scheduler_metadata,
        s_aux=None,
    )
    attention.fix_draft_rows(impl, query, key, cache, out, batch)
    assert kv.layout_checked

    expected = torch.empty(tokens, heads, d)
    for (ctx, n, tree, k, v), s in zip(seqs, starts):
        mask = torch.ones(n, ctx + n, dtype=torch.bool).tril(ctx)  # causal
        if tree is not None:
            mask[:, ctx:] = torch.from_numpy(tree.ancestor_mask())
        q = query[s : s + n].transpose(0, 1)
        expected[s : s + n] = F.scaled_dot_product_attention(
            q[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )[0].transpose(0, 1)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
