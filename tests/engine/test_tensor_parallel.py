"""Tensor parallel 2 on the CPU (one core per rank): greedy output with lookahead equals vLLM's
without speculation, drafts are accepted, and every rank built the very same drafts.

Every rank runs its own proposer; the scheduler sends rank 0's draft tokens to all of them, and
each rank lays out, verifies and compacts its own tree.  Ranks that drafted differently would
attend with different masks and compact different KV slots, so the test reads each rank's
drafts through ``collective_rpc`` (a running digest of every draft proposed, and how many
scheduled drafts did not match the rank's own tree) and requires them equal and zero -- after
greedy requests and after sampled ones (unseeded and seeded), whose verification draws random
numbers on every rank.
The bundled SmolLM2 has 9 attention heads and cannot be split in two; a toy Llama with 4 query and
2 KV heads can.  The default config runs: the cost-aware draft rule (on the toy model, whose forward
costs the same from 1 to 64 tokens, it drafts leads, candidates and window columns, so the
tree-attention pass runs on each shard), with one forward-cost model agreed by the ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import Engine, compare, specbench_questions

pytestmark = pytest.mark.engine

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def tp_model() -> str:
    from support.toy_model import build_toy_llama
    from vllm_lookahead.models import cache_root

    return str(build_toy_llama(Path(cache_root()) / "toy-llama-4h", num_heads=4, num_kv_heads=2))


def test_tensor_parallel_2_is_exact_and_ranks_draft_alike(tp_model, monkeypatch):
    from transformers import AutoTokenizer

    from vllm_lookahead.engine.hooks.step_context import rank_drafts

    tokenizer = AutoTokenizer.from_pretrained(tp_model)
    prompts = [tokenizer.encode(q["turns"][0])[: 12 + 8 * i] for i, q in enumerate(specbench_questions(limit=8))]
    base = Engine(tp_model, None)
    try:
        expected = base.generate(prompts, MAX_TOKENS, batch=4, logprobs=2)
    finally:
        base.close()
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # one core per rank (vLLM refuses otherwise here)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
    # the default config: the cost-aware draft rule, whose choices must not follow per-rank timing
    engine = Engine(tp_model, {"method": "lookahead"}, tensor_parallel_size=2)
    try:
        got = engine.generate(prompts, MAX_TOKENS, batch=4)
        metrics = engine.metrics()
        # sampled requests, unseeded and seeded: each rank verifies with its own random draws,
        # which must agree (vLLM seeds every rank alike), or the ranks' trees would part
        engine.generate(prompts, MAX_TOKENS, batch=4, temperature=0.8)
        engine.generate(
            prompts,
            MAX_TOKENS,
            batch=4,
            per_prompt=tuple({"seed": 7 + i} for i in range(4)),
            temperature=1.0,
            top_p=0.9,
        )
        ranks = engine.llm.collective_rpc(rank_drafts)
    finally:
        engine.close()
    report, failures = compare(expected, got, "TP=2 lookahead vs TP=1 no speculation")
    print("\n".join(report))
    assert not failures, failures
    assert metrics.get("vllm:spec_decode_num_accepted_tokens", 0) > 0, "no draft accepted: the test proves nothing"
    print(ranks)
    assert len(ranks) == 2
    assert ranks[0]["drafts"] > 0 and ranks[0]["window_steps"] > 0
    assert all(r["foreign"] == 0 for r in ranks), ranks
    assert ranks[0] == ranks[1], ranks
