"""Greedy lookahead == greedy without speculation, on the toy model, across (W, N, G) and vLLM features."""

from __future__ import annotations

import pytest
from harness import TOY_TREE, compare, counter_delta, mean_accepted_tokens, specbench_questions

pytestmark = pytest.mark.engine

MAX_TOKENS = 64


def toy_prompts(model: str, count: int = 24) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [q["turns"][0] for q in specbench_questions(limit=count)]
    # varied lengths: some prompts are long enough to be chunked under a small token budget
    prompts = [tokenizer.encode(t)[: 8 + 9 * (i % 12)] for i, t in enumerate(texts)]
    return prompts


def stop_cases(prompts_base) -> dict[str, dict]:
    stop_token = prompts_base[2].tokens[20]  # a token the output really produces, mid-stream
    seen = sorted({t for c in prompts_base for t in c.tokens})
    return {
        "max_tokens=5": dict(max_tokens=5),
        "max_tokens=17": dict(max_tokens=17),
        "stop_token": dict(max_tokens=MAX_TOKENS, stop_token_ids=[stop_token]),
        "stop_string": dict(max_tokens=MAX_TOKENS, stop=[_decode(prompts_base[3].tokens[18:20])]),
        # served undrafted (vLLM refuses them with speculation)
        "logit_bias": dict(max_tokens=24, logit_bias={stop_token: 5.0}),
        # drafted: what changes vLLM's sampled token is replayed per tree node (engine/step/target_dist.py)
        "min_p": dict(max_tokens=24, min_p=0.5),  # vLLM resets min_p for greedy requests
        "repetition_penalty": dict(max_tokens=MAX_TOKENS, repetition_penalty=1.3),
        "presence_frequency": dict(max_tokens=MAX_TOKENS, presence_penalty=0.8, frequency_penalty=0.4),
        "bad_words": dict(
            max_tokens=MAX_TOKENS,
            bad_words=[_decode(prompts_base[1].tokens[10:12]), _decode(prompts_base[4].tokens[8:9])],
        ),
        "allowed_token_ids": dict(max_tokens=32, allowed_token_ids=seen[::2]),
        "min_tokens": dict(max_tokens=MAX_TOKENS, min_tokens=30, stop_token_ids=[stop_token]),
        "logprobs": dict(max_tokens=MAX_TOKENS, logprobs=3),
        "logprobs=-1": dict(max_tokens=24, logprobs=-1),  # the whole vocabulary per token
        # structured-output requests (one draft chain each) in the same batch as tree-drafted ones
        "structured_mixed": dict(max_tokens=MAX_TOKENS, per_prompt=({}, {"structured_outputs": _choice()})),
    }


DRAFTED = (
    "repetition_penalty",
    "presence_frequency",
    "bad_words",
    "allowed_token_ids",
    "min_tokens",
    "logprobs",
    "logprobs=-1",
    "structured_mixed",
)
CHOICES = ("alpha beta gamma", "one two three four five")


def _decode(tokens: list[int]) -> str:
    from transformers import AutoTokenizer

    from vllm_lookahead.models import cache_root

    return AutoTokenizer.from_pretrained(str(cache_root() / "toy-llama")).decode(tokens, skip_special_tokens=True)


def _choice():
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(choice=list(CHOICES))


def default_jobs(prompts) -> list[tuple]:
    """Every no-speculation run the toy tests compare against (computed in one engine)."""
    return [(prompts, MAX_TOKENS, 8, {}), (prompts[:6], MAX_TOKENS, 1, {})]


# Full trees (no per-step cap) exercise every tree shape, with the lead candidate growing
# while accepted (max_lead_tokens 32; the toy model loops, so leads grow long) except in
# W1-N3-G4 (candidates of N-1 tokens, the paper's); candidates sharing a prefix are trie-merged
# (the default) except in W3-N4-G5; W0 drafts candidates without the window; the last config has a cap
# of 14 tokens per step: with 8 requests decoding nothing may be drafted (the proposer
# skips those requests' learning and catches up later), with 3 or fewer the batch
# drafts context-ranked candidates, and batch 1 runs three candidates per step; the last is the
# shipped "auto" (the cost-aware draft rule).
FULL = {"max_tokens_per_step": 0}
CONFIGS = [
    pytest.param({"window_size": 7, "ngram_size": 5, "guess_set_size": 7, **FULL}, id="W7-N5-G7-default"),
    pytest.param({"window_size": 5, "ngram_size": 2, "guess_set_size": 3, **FULL}, id="W5-N2-G3-jacobi"),
    pytest.param({"window_size": 4, "ngram_size": 4, "guess_set_size": 0, **FULL}, id="W4-N4-G0-no-pool"),
    pytest.param(
        {"window_size": 1, "ngram_size": 3, "guess_set_size": 4, "max_lead_tokens": 0, **FULL}, id="W1-N3-G4-lead-paper"
    ),
    pytest.param(
        {
            "window_size": 3,
            "ngram_size": 4,
            "guess_set_size": 5,
            "window_shift": "accepted",
            "merge_candidates": False,
            **FULL,
        },
        id="W3-N4-G5-shift-nomerge",
    ),
    pytest.param({"window_size": 0, "ngram_size": 4, "guess_set_size": 5, **FULL}, id="W0-N4-G5-no-window"),
    pytest.param(
        {"window_size": 3, "ngram_size": 4, "guess_set_size": 3, "lookup_context": 3, "max_tokens_per_step": 14},
        id="W3-N4-G3-ctx3-capped",
    ),
    # The shipped default: the cost rule sizes every step from the toy model's profiled forward
    # cost (nearly flat: it drafts leads, candidates and window columns, chains and trees).
    pytest.param({"window_size": 7, "ngram_size": 5, "guess_set_size": 7}, id="W7-N5-G7-auto-rule"),
]


@pytest.mark.parametrize("params", CONFIGS)
def test_toy_greedy_identical(toy_model, baselines, engines, params):
    prompts = toy_prompts(toy_model)
    baselines.prefetch(toy_model, {}, default_jobs(prompts))
    base8 = baselines.get(toy_model, {}, prompts, MAX_TOKENS, batch=8)
    base1 = baselines.get(toy_model, {}, prompts[:6], MAX_TOKENS, batch=1)
    engine = engines.get(toy_model, {"method": "lookahead", **params})
    before = engine.metrics()
    got8 = engine.generate(prompts, MAX_TOKENS, batch=8)
    middle = engine.metrics()
    got1 = engine.generate(prompts[:6], MAX_TOKENS, batch=1)
    after = engine.metrics()
    metrics, metrics1 = counter_delta(before, after), counter_delta(middle, after)
    report8, fail8 = compare(base8, got8, "batch8")
    report1, fail1 = compare(base1, got1, "batch1")
    print("\n".join(report8 + report1))
    assert not fail8 and not fail1, "\n".join(fail8 + fail1)
    mat, mat1 = mean_accepted_tokens(metrics), mean_accepted_tokens(metrics1)
    print(f"{params}: MAT {mat:.2f} (batch 1: {mat1:.2f}), drafts {metrics.get('vllm:spec_decode_num_drafts')}")
    assert metrics.get("vllm:spec_decode_num_drafts", 0) > 0
    if params["guess_set_size"] == 0 and params["ngram_size"] > 2:
        # No pool, no verification branch: only a fresh window (one level, sampled from the
        # prompt) has logits on its level-0 chain, so at most W-1 drafts per request (one
        # warm-up step each; no preemption at this load) can ever be accepted.
        accepted = metrics.get("vllm:spec_decode_num_accepted_tokens", 0)
        assert accepted <= (params["window_size"] - 1) * (len(prompts) + 6)
        assert mat < 1.05
    else:
        # the toy model's greedy output loops: lookahead must find and accept those n-grams
        # (judged at batch 1, where every config may draft every step)
        assert mat1 > 1.2


STRESS = dict(
    max_num_seqs=16,
    max_num_batched_tokens=96,  # chunked prefill + drafts truncated by the token budget
    enable_chunked_prefill=True,
    enable_prefix_caching=True,
    block_size=32,
    num_gpu_blocks_override=20,  # 640 tokens of KV for 16 requests: forces preemption
    max_model_len=512,
)


STRESS_SPEC = {"method": "lookahead", "window_size": 4, "ngram_size": 4, "guess_set_size": 4, **FULL}


def test_toy_stress_chunked_prefill_prefix_cache_preemption(toy_model, baselines, engines):
    prompts = toy_prompts(toy_model, 16)
    long_prompt = (sum(prompts, []) * 4)[:470]  # 470 + 96 > max_model_len 512: stops at the limit
    prompts = prompts + prompts[:8] + [long_prompt]
    base = baselines.get(toy_model, STRESS, prompts, 96, batch=25)
    # then the two longest prompts again, one after the other: the second hits the prefix cache
    again = sorted(prompts, key=len)[-1:] * 2
    base_again = baselines.get(toy_model, STRESS, again, 96, batch=1)
    engine = engines.get(toy_model, STRESS_SPEC, **STRESS)
    before = engine.metrics()
    got = engine.generate(prompts, 96, batch=25)
    got_again = engine.generate(again, 96, batch=1)
    metrics = counter_delta(before, engine.metrics())
    report, failures = compare(base + base_again, got + got_again, "stress")
    print("\n".join(report))
    print({k: v for k, v in metrics.items() if "preempt" in k or "spec_decode_num" in k or "prefix_cache" in k})
    assert not failures, "\n".join(failures)
    assert metrics.get("vllm:num_preemptions", 0) > 0, "the stress setting no longer preempts; shrink the cache"
    assert metrics.get("vllm:prefix_cache_hits", 0) > 0
    assert len(got[len(prompts) - 1].tokens) == 512 - 470  # generation ran into max_model_len
    assert metrics.get("vllm:spec_decode_num_accepted_tokens", 0) > 0


def test_toy_stops_limits_and_fallback_requests(toy_model, baselines, engines):
    """max_tokens / stop tokens inside accepted n-grams, and requests that must not be drafted."""
    prompts = toy_prompts(toy_model)
    baselines.prefetch(toy_model, {}, default_jobs(prompts))
    cases = stop_cases(baselines.get(toy_model, {}, prompts, MAX_TOKENS, batch=8))
    jobs = [(prompts, c["max_tokens"], 8, {k: v for k, v in c.items() if k != "max_tokens"}) for c in cases.values()]
    baselines.prefetch(toy_model, {}, jobs)
    wanted = {name: baselines.get(toy_model, {}, j[0], j[1], j[2], **j[3]) for name, j in zip(cases, jobs)}
    stop_token = cases["stop_token"]["stop_token_ids"][0]
    engine = engines.get(toy_model, TOY_TREE)  # shared with test_toy_sampling_features.py
    failures = []
    for name, params in cases.items():
        max_tokens = params.pop("max_tokens")
        want = wanted[name]
        before = engine.metrics().get("vllm:spec_decode_num_drafts", 0)
        got = engine.generate(prompts, max_tokens, batch=8, **params)
        drafted = engine.metrics().get("vllm:spec_decode_num_drafts", 0) - before
        report, fail = compare(want, got, name)
        print(name, "drafted steps:", drafted, *report, sep="\n  ")
        failures += fail
        if name == "logit_bias":
            assert drafted == 0, f"{name} requests must run without drafts"
        if name in DRAFTED:
            assert drafted > 0, f"{name} requests should carry drafts"
        if name == "structured_mixed":
            texts = [_decode(c.tokens) for c in got[1::2]]
            assert all(t in CHOICES for t in texts), texts  # never a token the grammar forbids
        if name == "stop_token":
            assert all(stop_token not in c.tokens[:-1] for c in got)
        if name == "min_tokens":
            assert all(len(c.tokens) >= 30 for c in got)
        if name.startswith("logprobs"):
            for w, g in zip(want, got):
                n = min(len(w.logprobs), len(g.logprobs))
                assert n and all(abs(a - b) <= 1e-4 for a, b in zip(w.logprobs[:n], g.logprobs[:n])), (
                    w.logprobs,
                    g.logprobs,
                )
    assert not failures, "\n".join(failures)


def test_seeded_requests_with_chunked_prefill_keep_the_engine_alive(toy_model, baselines, engines):
    """vLLM 0.32 on CPU kills its engine when a seeded request's prompt is prefilled in chunks (it
    rewinds the request's generator by a CUDA-only offset; engine/hooks/seeded_prefill.py): with the plugin
    loaded, such requests are served with and without speculation -- with lookahead, whose drafts
    make chunked prefills frequent, the same tokens as without -- and the engine stays exact for
    the next ones."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = toy_prompts(toy_model, 16)
    long_prompts = [(sum(prompts[k:], []) * 4)[: 250 + 40 * k] for k in range(6)]  # > the 96-token budget
    sps = [SamplingParams(temperature=0.8, seed=100 + k, max_tokens=24) for k in range(6)]
    inputs = [TokensPrompt(prompt_token_ids=p) for p in long_prompts]
    expected = baselines.get(toy_model, STRESS, prompts[:8], 48, batch=8)
    reference = engines.get(toy_model, None, **STRESS).llm.generate(inputs, sps, use_tqdm=False)
    engine = engines.get(toy_model, STRESS_SPEC, **STRESS)
    results = engine.llm.generate(inputs, sps, use_tqdm=False)
    assert [len(r.outputs[0].token_ids) for r in results] == [24] * 6
    assert [list(r.outputs[0].token_ids) for r in results] == [list(r.outputs[0].token_ids) for r in reference]
    report, failures = compare(expected, engine.generate(prompts[:8], 48, batch=8), "after seeded chunked prefills")
    assert not failures, "\n".join(failures)


def test_prefix_cache_hit_inside_compacted_drafts(toy_model, baselines, engines):
    """A second request whose prompt is the first one's prompt plus part of its output reuses the
    first one's cached KV blocks -- blocks written by tree steps, their accepted paths compacted
    into place -- and ends inside such a block: its greedy output equals no speculation's.
    (vLLM 0.33 caches a drafting request's full blocks right after each step; on 0.32 they are
    cached as they fill and kept after the request ends.)"""
    prompt = toy_prompts(toy_model, 1)[0][:40]
    (first,) = baselines.get(toy_model, {}, [prompt], 128, batch=1)
    follow = prompt + first.tokens[: 32 * 4 + 5 - len(prompt)]  # 4 full blocks of 32, ends 5 tokens into the 5th
    (want,) = baselines.get(toy_model, {}, [follow], 48, batch=1)
    engine = engines.get(toy_model, TOY_TREE)
    before = engine.metrics()
    (got_first,) = engine.generate([prompt], 128, batch=1)
    middle = engine.metrics()
    (got,) = engine.generate([follow], 48, batch=1)
    drafted, reused = counter_delta(before, middle), counter_delta(middle, engine.metrics())
    report, failures = compare([first, want], [got_first, got], "prefix inside drafts")
    print("\n".join(report) or "identical", {k: v for k, v in reused.items() if "prefix_cache" in k})
    assert not failures, "\n".join(failures)
    assert drafted.get("vllm:spec_decode_num_accepted_tokens", 0) > 20  # the first request's blocks came from trees
    assert reused.get("vllm:prefix_cache_hits", 0) >= 32 * 4  # the second reused them, generated tokens included
