"""256 requests in flight on the (sharp) toy model, in one engine step after another: greedy
lookahead emits what no speculation emits, and seeded sampled requests the same tokens -- with full
trees for every request (the largest steps: ~5,000 tokens) and under the draft rule (idle requests
resting, their rests spread)."""

from __future__ import annotations

import pytest
from harness import compare, counter_delta
from test_toy_exactness import toy_prompts

pytestmark = pytest.mark.engine

IN_FLIGHT = 256
MAX_TOKENS = 32
LARGE = {"max_num_seqs": IN_FLIGHT, "max_num_batched_tokens": 8192}  # vLLM's budget on an H100
SEEDED = tuple({"temperature": 0.8, "seed": 500 + i} for i in range(IN_FLIGHT))
CONFIGS = [
    pytest.param({"method": "lookahead", "max_tokens_per_step": 0, "max_lead_tokens": 8}, id="full-trees"),
    pytest.param({"method": "lookahead"}, id="auto-rule"),
]


def large_batch_prompts(model: str) -> list[list[int]]:
    """256 prompts: the toy prompts, each copy cut a token shorter than the last."""
    base = toy_prompts(model, 24)
    return [base[i % 24][: max(4, len(base[i % 24]) - i // 24)] for i in range(IN_FLIGHT)]


@pytest.mark.parametrize("spec", CONFIGS)
def test_256_in_flight_match_no_speculation(sharp_toy_model, baselines, engines, spec):
    prompts = large_batch_prompts(sharp_toy_model)
    jobs = [(prompts, MAX_TOKENS, IN_FLIGHT, {}), (prompts, MAX_TOKENS, IN_FLIGHT, {"per_prompt": SEEDED})]
    baselines.prefetch(sharp_toy_model, LARGE, jobs)
    greedy_base = baselines.get(sharp_toy_model, LARGE, prompts, MAX_TOKENS, IN_FLIGHT)
    seeded_base = baselines.get(sharp_toy_model, LARGE, prompts, MAX_TOKENS, IN_FLIGHT, per_prompt=SEEDED)
    engine = engines.get(sharp_toy_model, spec, **LARGE)
    before = engine.metrics()
    greedy = engine.generate(prompts, MAX_TOKENS, batch=IN_FLIGHT)
    seeded = engine.generate(prompts, MAX_TOKENS, batch=IN_FLIGHT, per_prompt=SEEDED)
    metrics = counter_delta(before, engine.metrics())
    report, failures = compare(greedy_base, greedy, "greedy")
    print("\n".join(report))
    assert not failures, "\n".join(failures)
    mismatched = [i for i, (a, b) in enumerate(zip(seeded_base, seeded)) if a.tokens != b.tokens]
    assert not mismatched, f"seeded requests {mismatched[:10]} differ from no speculation"
    drafts = metrics.get("vllm:spec_decode_num_drafts", 0)
    print(f"{spec}: {drafts:.0f} drafts, {metrics.get('vllm:spec_decode_num_accepted_tokens', 0):.0f} accepted")
    if spec.get("max_tokens_per_step") == 0:
        assert drafts >= IN_FLIGHT and metrics.get("vllm:spec_decode_num_accepted_tokens", 0) > 0
