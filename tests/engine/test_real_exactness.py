"""Lookahead == no speculation on the bundled SmolLM2-135M-Instruct (fp32): greedy, and
sampled requests with a seed.

Greedy: 32 Spec-Bench prompts (MT-bench first turns, summarization, qa, math reasoning: 8
each) at batch 8, and every fourth of them (2 per category) at batch 1 (CI time).  Any
differing token must sit on a numerical tie of the no-speculation run (top-two logits within
fp32 rounding); the gap is printed for each.

Seeded sampling: verification draws, per emitted token, the noise vLLM's sampler draws for
that position from the request's generator (engine/step/sampler_noise.py), so a seeded request's
tokens are vLLM's own: at T 0.5 / 0.8 / 1.0 with top-k, top-p and penalties, the same tokens
with and without lookahead, drafts accepted; the same seed twice in one batch and in
batches of other sizes gives the same tokens.
"""

from __future__ import annotations

import pytest
from harness import REAL_TREE, compare, counter_delta, mean_accepted_tokens, real_prompt, specbench_questions

pytestmark = [pytest.mark.engine, pytest.mark.real_model]

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SETTINGS = dict(max_model_len=4096, max_num_seqs=64)  # 64: the sampling tests (same engine) submit hundreds at once
TOKENS_B1, TOKENS_B8 = 48, 48


def real_prompts(model: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    questions = []
    for cats in (MT_BENCH, ("summarization",), ("qa",), ("math_reasoning",)):
        rows = specbench_questions(cats)
        questions += rows[:: max(1, len(rows) // 8)][:8]
    prompts = []
    for q in questions:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    assert len(prompts) == 32
    return prompts


def test_real_model_greedy_identical(real_model, baselines, engines):
    prompts = real_prompts(real_model)
    prompts1 = prompts[::4]
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
    print("\n".join(report1 + report8) or "all 40 completions identical")
    mat1 = mean_accepted_tokens(counter_delta(before, mid))
    mat8 = mean_accepted_tokens(counter_delta(mid, after))
    print(f"MAT batch1 {mat1:.3f}, batch8 {mat8:.3f}")
    assert not fail1 and not fail8, "\n".join(fail1 + fail8)
    assert mat1 > 1.1 and mat8 > 1.1


SEEDED = tuple(
    {**params, "seed": 100 + i}
    for i, params in enumerate(
        [
            {"temperature": 0.5},
            {"temperature": 0.8, "top_k": 20},
            {"temperature": 1.0, "top_p": 0.9},
            {"temperature": 0.8, "repetition_penalty": 1.1, "presence_penalty": 0.3},
        ]
        * 2
    )
)
TOKENS_SEEDED = 48


def test_real_model_seeded_sampling_identical(real_model, baselines, engines):
    prompts = [real_prompt(real_model), *real_prompts(real_model)[::5][:7]]
    base = baselines.get(real_model, SETTINGS, prompts, TOKENS_SEEDED, batch=8, per_prompt=SEEDED)
    engine = engines.get(real_model, REAL_TREE, **SETTINGS)
    before = engine.metrics()
    got = engine.generate(prompts, TOKENS_SEEDED, batch=8, per_prompt=SEEDED)
    mat = mean_accepted_tokens(counter_delta(before, engine.metrics()))
    differ = [
        f"prompt {i} {SEEDED[i]}: first difference at token "
        f"{next(j for j, (x, y) in enumerate(zip(b.tokens, g.tokens)) if x != y)}"
        for i, (b, g) in enumerate(zip(base, got))
        if b.tokens != g.tokens
    ]
    print(f"seeded: MAT {mat:.3f}; " + ("; ".join(differ) or f"all {len(prompts)} completions identical"))
    assert not differ, differ
    assert mat > 1.1, f"no drafts accepted (MAT {mat:.3f}): the test would prove nothing"
    # The same seed twice in one batch, and in a batch of one: the same tokens again.
    twice = engine.generate(
        [prompts[0], prompts[0], prompts[1], prompts[1]],
        TOKENS_SEEDED,
        batch=4,
        per_prompt=(SEEDED[0], SEEDED[0], SEEDED[1], SEEDED[1]),
    )
    alone = engine.generate(prompts[:2], TOKENS_SEEDED, batch=1, per_prompt=SEEDED[:2])
    assert [c.tokens for c in twice] == [got[0].tokens, got[0].tokens, got[1].tokens, got[1].tokens]
    assert [c.tokens for c in alone] == [got[0].tokens, got[1].tokens]
