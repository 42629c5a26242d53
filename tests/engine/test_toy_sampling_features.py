"""Random sampling with lookahead on the (sharp) toy model: seeds, mixed batches, n > 1,
logprobs, structured output -- and the tests of the statistical test, with wrong acceptance
rules swapped into an in-process engine."""

from __future__ import annotations

import pytest
from harness import THINK_END, THINK_START, TOY_TREE, Engine, compare, counter_delta

from support.stats import compare_samples
from support.wrong_rules import WRONG_RULES

pytestmark = pytest.mark.engine

TREE = TOY_TREE  # the engine the exactness and statistics tests share


def _prompts(model: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    from support import DEFAULT_PROMPTS

    tok = AutoTokenizer.from_pretrained(model)
    return [tok.encode(t * 3) for t in DEFAULT_PROMPTS[:8]]


MIXED = (
    {},  # greedy
    {"temperature": 0.8, "seed": 11},
    {"temperature": 0.8},  # unseeded
    {"temperature": 1.0, "top_k": 5, "seed": 12, "repetition_penalty": 1.1},
    {"temperature": 0.7, "top_p": 0.9, "seed": 13, "logprobs": 2},
    {"temperature": 0.0, "presence_penalty": 0.5},
    {"temperature": 1.0, "seed": 14, "min_tokens": 20},
    {"temperature": 0.9, "seed": 15, "bad_words": ["( ("]},
)


def test_mixed_batch_seeds_reproduce_and_greedy_is_exact(sharp_toy_model, baselines, engines):
    prompts = _prompts(sharp_toy_model)
    want = baselines.get(sharp_toy_model, {}, prompts, 40, batch=8, per_prompt=MIXED)
    engine = engines.get(sharp_toy_model, TREE)
    before = engine.metrics()
    first = engine.generate(prompts, 40, batch=8, per_prompt=MIXED)
    second = engine.generate(prompts, 40, batch=8, per_prompt=MIXED)
    metrics = counter_delta(before, engine.metrics())
    n_outputs = _n_samples(engine, prompts[0])
    assert metrics.get("vllm:spec_decode_num_accepted_tokens", 0) > 0
    for i, params in enumerate(MIXED):
        if params.get("temperature", 0.0) == 0.0:  # greedy (with or without penalties): vLLM's tokens
            report, failures = compare([want[i]], [first[i]], f"greedy prompt {i}")
            assert not failures, report
        if "seed" in params:  # seeded: vLLM's own tokens, in both runs
            assert first[i].tokens == want[i].tokens == second[i].tokens, (i, params)
        if "min_tokens" in params:
            assert len(first[i].tokens) >= params["min_tokens"]
    assert n_outputs[0] == n_outputs[1] and len(n_outputs[0]) == 3 and len(set(map(tuple, n_outputs[0]))) > 1
    assert n_outputs[0] == _n_samples(engines.get(sharp_toy_model, None), prompts[0])[0]  # and vLLM's own


def _n_samples(engine: Engine, prompt: list[int]) -> list[list[list[int]]]:
    """n = 3 with a seed, twice: three completions each time (sorted)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    runs = []
    for _ in range(2):
        (res,) = engine.llm.generate(
            [TokensPrompt(prompt_token_ids=prompt)],
            SamplingParams(n=3, temperature=0.9, seed=5, max_tokens=24),
            use_tqdm=False,
        )
        runs.append(sorted(list(o.token_ids) for o in res.outputs))
    return runs


def test_sampled_logprobs_and_structured_output(sharp_toy_model, engines):
    """Logprobs of sampled tokens equal vLLM's own for those tokens (scored by the engine without
    speculation as prompt logprobs); a sampled structured-output request never leaves its grammar."""
    from vllm.sampling_params import StructuredOutputsParams

    prompts = _prompts(sharp_toy_model)[:4]
    choices = ["alpha beta gamma", "one two three four five", "def f(x): return x"]
    engine = engines.get(sharp_toy_model, TREE)
    before = engine.metrics()
    sampled = engine.generate(prompts, 32, batch=4, temperature=0.9, top_k=20, seed=3, logprobs=1)
    structured = engine.generate(
        prompts * 4, 24, batch=16, temperature=1.0, structured_outputs=StructuredOutputsParams(choice=choices)
    )
    drafted = counter_delta(before, engine.metrics()).get("vllm:spec_decode_num_drafts", 0)
    tok = engine.tokenizer()
    assert drafted > 0
    # Never a token the grammar forbids: a finished output is a choice (then EOS), one cut by
    # max_tokens (sampling may spell a choice in many small tokens) a prefix of one.
    texts = [(tok.decode(c.tokens, skip_special_tokens=True), len(c.tokens) < 24) for c in structured]
    bad = [t for t, done in texts if not (t in choices if done else any(ch.startswith(t) for ch in choices))]
    assert not bad and sum(done for _, done in texts) >= len(texts) // 2, (bad, texts)
    scored = engines.get(sharp_toy_model, None).generate(
        [p + c.tokens for p, c in zip(prompts, sampled)], 1, batch=4, prompt_logprobs=0
    )
    for p, c, s in zip(prompts, sampled, scored):
        expected = s.prompt_logprobs[len(p) :]
        assert len(expected) == len(c.logprobs) == len(c.tokens)
        assert max(abs(a - b) for a, b in zip(c.logprobs, expected)) < 1e-3, (c.logprobs, expected)


def test_structured_requests_beside_large_trees(sharp_toy_model, engines):
    """Greedy structured-output requests (chains) in one batch with greedy requests drafting full
    trees: vLLM's grammar code finds each request's logits rows by the rows it owns (in vLLM 0.33
    in fixed blocks of 1 + num_speculative_tokens), so large trees beside a structured request
    must not shift its rows -- every output equals no speculation's and stays in its grammar."""
    from vllm.sampling_params import StructuredOutputsParams

    choices = ["alpha beta gamma", "one two three four five", "def f(x): return x"]

    def per_prompt():  # fresh params per run: vLLM rewrites a choice into a grammar in place
        structured = {"structured_outputs": StructuredOutputsParams(choice=choices)}
        return ({}, structured, {}, {}, structured, {}, {}, structured)

    prompts = _prompts(sharp_toy_model)
    want = engines.get(sharp_toy_model, None).generate(prompts, 32, batch=8, per_prompt=per_prompt())
    engine = engines.get(sharp_toy_model, TREE)  # full trees, no per-step cap
    before = engine.metrics()
    got = engine.generate(prompts, 32, batch=8, per_prompt=per_prompt())
    accepted = counter_delta(before, engine.metrics()).get("vllm:spec_decode_num_accepted_tokens", 0)
    report, failures = compare(want, got, "structured beside trees")
    assert not failures, report
    tok = engine.tokenizer()
    for c, params in zip(got, per_prompt()):
        if params:
            assert tok.decode(c.tokens, skip_special_tokens=True) in choices
    assert accepted > 0


def test_a_fully_cached_prompt_is_not_padded_with_placeholder_drafts(sharp_toy_model, engines):
    """vLLM pads a new request whose prompt is all in the prefix cache to 1 + K placeholder rows
    (K = num_speculative_tokens, up to 83 for lookahead); the plugin's draft-length schedule
    turns that off, so such a request's one-token prefill computes one row."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from support import cycle_prompt

    engine = engines.get(sharp_toy_model, TREE)
    prompt = cycle_prompt(sharp_toy_model, 65, start=300)  # 2 blocks of 32 + 1 token
    engine.llm.generate([TokensPrompt(prompt_token_ids=prompt)], SamplingParams(max_tokens=1), use_tqdm=False)
    before = engine.metrics()
    engine.llm.generate([TokensPrompt(prompt_token_ids=prompt)], SamplingParams(max_tokens=1), use_tqdm=False)
    delta = counter_delta(before, engine.metrics())
    assert delta.get("vllm:prefix_cache_hits", 0) >= 64
    assert delta.get("vllm:spec_decode_num_draft_tokens", 0) == 0


def test_thinking_budget_drafts_and_forces_the_end_where_vllm_does(sharp_toy_model, baselines, engines):
    """Requests with a thinking_token_budget (the engines' reasoning config: ``<think>`` ...
    ``</think>``, several toy tokens each) are drafted for, and the end marker is forced exactly
    where vLLM forces it without speculation: greedy outputs equal the no-speculation run's, and
    along every output (sampled ones too) each token vLLM's budget state machine would force is
    the token emitted there."""
    from transformers import AutoTokenizer

    from support.thinking import forced_tokens

    tok = AutoTokenizer.from_pretrained(sharp_toy_model)
    start = tok.encode(THINK_START, add_special_tokens=False)  # as vLLM's ReasoningConfig does
    end = tok.encode(THINK_END, add_special_tokens=False)
    base = _prompts(sharp_toy_model)
    # Prompts that open a section 0-5 tokens before their end, and two whose section is closed.
    prompts = [p + start + p[:k] for k, p in zip((0, 1, 2, 3, 0, 5), base[:6])]
    prompts += [p + start + p[:3] + end for p in base[6:8]]
    budgets = (4, 10, 24, 40, 0, 16, 8, 8)
    greedy = tuple({"thinking_token_budget": b} for b in budgets)
    sampled = tuple({"thinking_token_budget": b, "temperature": 0.8, "seed": 20 + i} for i, b in enumerate(budgets))
    want = baselines.get(sharp_toy_model, {}, prompts, 64, batch=8, per_prompt=greedy)
    engine = engines.get(sharp_toy_model, TREE)  # after the baseline's engine: its metrics are the ones served
    reasoning = engine.llm.llm_engine.vllm_config.reasoning_config
    assert (reasoning.reasoning_start_token_ids, reasoning.reasoning_end_token_ids) == (start, end)
    before = engine.metrics()
    got = engine.generate(prompts, 64, batch=8, per_prompt=greedy)
    got_sampled = engine.generate(prompts, 64, batch=8, per_prompt=sampled)
    metrics = counter_delta(before, engine.metrics())
    report, failures = compare(want, got, "thinking budget")
    assert not failures, report
    n_forced = 0
    for prompt, budget, *outputs in zip(prompts, budgets, want, got, got_sampled):
        for out in outputs:
            forced = forced_tokens(start, end, budget, prompt, out.tokens)
            assert all(out.tokens[m] == t for m, t in forced.items()), (budget, forced, out.tokens)
            n_forced += len(forced)
    assert n_forced >= 3 * 6 * len(end)  # the six open sections are forced shut in all three runs
    drafts = metrics.get("vllm:spec_decode_num_drafts", 0)
    assert drafts > 0 and metrics.get("vllm:spec_decode_num_accepted_tokens", 0) > drafts / 2  # MAT > 1.5


# -- the tests of the test -------------------------------------------------------------

SAMPLES = 2000
TOKENS = 3
SETTING = dict(temperature=1.0, top_k=5)
# candidates keyed by the last token only, several per key: the root gets several children
WIDE_TREE = {**TREE, "lookup_context": 1, "guess_set_size": 6}


def _branching_prompt(engine: Engine) -> list[int]:
    """A prompt whose sampled continuation branches where the pool branches.

    The sharp toy's continuation of ``base`` is nearly deterministic for two tokens
    (``t0`` from the prefill, then ``t1``) and then splits between two likely tokens
    ``a`` and ``b``.  The prompt holds ``t0 t1 a`` and ``t0 t1 b``, so the first drafted
    step's tree (root ``t0``, candidates keyed by it, merged) is ``t1`` with two children
    that both carry real mass: exactly where the wrong rules differ from the right one."""
    from support import DEFAULT_PROMPTS

    tok = engine.tokenizer()
    seed = tok.encode(DEFAULT_PROMPTS[0])
    (greedy,) = engine.generate([seed], 26, batch=1, ignore_eos=True)
    base, (t0, t1) = seed + greedy.tokens[:24], greedy.tokens[24:]
    ranked = sorted(_top_logprobs(engine, base + [t0, t1]).items(), key=lambda kv: -kv[1])
    a, b = ranked[0][0], ranked[1][0]
    return [t0, t1, a, t0, t1, b] + base


def _top_logprobs(engine: Engine, prompt: list[int]) -> dict[int, float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    (res,) = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=prompt)], SamplingParams(max_tokens=1, logprobs=5), use_tqdm=False
    )
    return {t: lp.logprob for t, lp in res.outputs[0].logprobs[0].items()}


def _samples(engine: Engine, prompt: list[int], seed_base: int) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sps = [SamplingParams(max_tokens=TOKENS, ignore_eos=True, seed=seed_base + i, **SETTING) for i in range(SAMPLES)]
    return [
        list(r.outputs[0].token_ids)
        for r in engine.llm.generate([TokensPrompt(prompt_token_ids=prompt)] * SAMPLES, sps, use_tqdm=False)
    ]


def _histograms(samples):
    from collections import Counter

    hists = {f"token {i}": Counter(s[i] for s in samples) for i in range(TOKENS)}
    hists.update({f"tokens {i},{i + 1}": Counter((s[i], s[i + 1]) for s in samples) for i in range(TOKENS - 1)})
    return hists


def test_wrong_acceptance_rules_fail_the_statistical_test(sharp_toy_model, engines, monkeypatch):
    """The lookahead engine runs in this process so its acceptance rule can be swapped: the
    shipped rule (the walk coupled to vLLM's sampler noise) and SpecInfer's rule (what samplers
    without such noise get) pass the same chi-square comparison that each deliberately wrong
    rule fails.  Rules other than the coupled walk run where the sampler's noise is not mirrored."""
    from types import SimpleNamespace

    import vllm_lookahead.engine.step.verification as verify_step

    reference = engines.get(sharp_toy_model, None)
    prompt = _branching_prompt(reference)
    ref = _samples(reference, prompt, 0)
    engine = Engine(sharp_toy_model, WIDE_TREE)
    results = {}
    try:
        for name in ["the rule", "SpecInfer's rule", *WRONG_RULES]:
            if name != "the rule":
                monkeypatch.setattr(verify_step, "SamplerNoise", SimpleNamespace(of=lambda sampler: None))
            if name in WRONG_RULES:
                monkeypatch.setattr(verify_step, "tree_speculative_sample", WRONG_RULES[name])
            before = engine.metrics()
            got = _samples(engine, prompt, 1_000_000 * (len(results) + 1))
            accepted = counter_delta(before, engine.metrics()).get("vllm:spec_decode_num_accepted_tokens", 0)
            results[name] = (compare_samples(_histograms(ref), _histograms(got), alpha=1e-4), accepted)
    finally:
        engine.close()
    for name, (comparison, accepted) in results.items():
        print(f"{name}: accepted {accepted}\n{comparison.summary()}")
    for name in ("the rule", "SpecInfer's rule"):
        assert results[name][0].passed and results[name][1] > 0, name
    for name in WRONG_RULES:
        assert not results[name][0].passed, f"the chi-square test did not notice the wrong rule '{name}'"
