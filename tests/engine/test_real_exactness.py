"""Greedy lookahead == greedy without speculation on the bundled SmolLM2-135M-Instruct (fp32).

32 Spec-Bench prompts (MT-bench first turns, summarization, qa, math reasoning: 8 each) at
batch 8, and every other one of them (4 per category) at batch 1 (CI time).  Any differing token must sit on a numerical tie of the
no-speculation run (top-two logits within fp32 rounding); the gap is printed for each.
"""

from __future__ import annotations

import pytest

from harness import REAL_TREE, compare, counter_delta, mean_accepted_tokens, specbench_questions

pytestmark = [pytest.mark.engine, pytest.mark.real_model]

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SETTINGS = dict(max_model_len=4096, max_num_seqs=64)  # 64: the sampling tests (same engine) submit hundreds at once
TOKENS_B1, TOKENS_B8 = 48, 64


def real_prompts(model: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    questions = []
    for cats in (MT_BENCH, ("summarization",), ("qa",), ("math_reasoning",)):
        rows = specbench_questions(cats)
        questions += rows[:: max(1, len(rows) // 8)][:8]
    prompts = []
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    assert len(prompts) == 32
    return prompts


def test_real_model_greedy_identical(real_model, baselines, engines):
    prompts = real_prompts(real_model)
    prompts1 = prompts[::2]
    baselines.prefetch(real_model, SETTINGS, [(prompts1, TOKENS_B1, 1, {}), (prompts, TOKENS_B8, 8, {})])
    base1 = baselines.get(real_model, SETTINGS, prompts1, TOKENS_B1, batch=1)
    base8 = baselines.get(real_model, SETTINGS, prompts, TOKENS_B8, batch=8)
    # Branching trees with the window, no per-step cap: every draft row goes through the
    # tree-attention path (the paper's full 7/5/7 trees run on the toy model, test_toy_exactness.py).
    # The engine is shared with test_sampling_stats.py.
    engine = engines.get(real_model, REAL_TREE, **SETTINGS)
    before = engine.metrics()
    got1 = engine.generate(prompts1, TOKENS_B1, batch=1)
    mid = engine.metrics()
    got8 = engine.generate(prompts, TOKENS_B8, batch=8)
    after = engine.metrics()
    report1, fail1 = compare(base1, got1, "batch1")
    report8, fail8 = compare(base8, got8, "batch8")
    print("\n".join(report1 + report8) or "all 48 completions identical")
    mat1 = mean_accepted_tokens(counter_delta(before, mid))
    mat8 = mean_accepted_tokens(counter_delta(mid, after))
    print(f"MAT batch1 {mat1:.3f}, batch8 {mat8:.3f}")
    assert not fail1 and not fail8, "\n".join(fail1 + fail8)
    assert mat1 > 1.1 and mat8 > 1.1
