"""Sampling with lookahead has vLLM's own output distribution: chi-square tests.

A copy-friendly prompt -- one whose continuation the pools can predict, so drafts get
accepted -- is sampled ``SAMPLES`` times per mode and setting (``REAL_SAMPLES`` for SmolLM2,
CI time), each request with its own
seed: one lead chain per request (drafted every step) and branching trees (several candidates,
merged where they share a first token, plus the Jacobi window).  The first ``TOKENS``
tokens are compared -- each position and each pair of consecutive tokens -- with chi-square
tests, Bonferroni-corrected (tests/support/stats.py):

* toy model (the sharp variant, so drafts are accepted at temperature 1 too): against the
  same engine settings without speculation, two-sample tests, at four settings, and the tree
  configuration at two of them with requests that have no seed (``UNSEEDED_SETTINGS``: their
  walks sample each position by the inverse CDF, not the sampler's noise);
* SmolLM2 (CI time on this CPU): against the exact distribution of plain sampling --
  the model's logits (Hugging Face transformers, fp32) through vLLM's own temperature and
  top-k/top-p op, prefix by prefix -- goodness-of-fit tests; each of the four settings once,
  each configuration at two of them (``REAL``).

The first token comes from the prefill; the next two from the request's first drafted
step, which each run must show accepting drafts (MAT > 1).  The tests of these tests --
the same comparison failing for deliberately wrong acceptance rules -- are in
test_toy_sampling_features.py.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from harness import REAL_TREE, TOY_TREE, Engine, counter_delta, mean_accepted_tokens, real_prompt

from support.stats import compare_samples, compare_to_exact

pytestmark = pytest.mark.engine

SAMPLES = 1500
REAL_SAMPLES = 800  # SmolLM2's requests cost ~10x the toy's; the rules' power: test_toy_sampling_features.py
TOKENS = 3
ALPHA = 1e-4  # family-wise, per (model, configuration, setting)
EXACT_FLOOR = 1e-5  # exact reference: prefixes (and next tokens) less likely than this are not enumerated
OTHER = -1  # a sample outside the enumerated prefixes
EXACT_BATCH = 64  # exact reference: prefixes per forward (each carries a copy of the prompt's KV)
SETTINGS = {
    "T=0.7": dict(temperature=0.7),
    "T=1.0": dict(temperature=1.0),
    "T=1.0 top-p 0.9": dict(temperature=1.0, top_p=0.9),
    "T=0.7 top-k 5": dict(temperature=0.7, top_k=5),
    "T=1.0 top-k 5": dict(temperature=1.0, top_k=5),
}
TOY_SETTINGS = ("T=0.7", "T=1.0", "T=1.0 top-p 0.9", "T=0.7 top-k 5")
UNSEEDED_SETTINGS = ("T=1.0", "T=0.7 top-k 5")
# The lead candidate as one chain, drafted every step (the draft rule may choose not to draft at
# 8 requests in flight; this test is about the sampling rule over chains, so it must draft).
CHAIN = {"method": "lookahead", "window_size": 0, "guess_set_size": 1, "max_tokens_per_step": 0}
# SmolLM2 (CI time): each of the four settings once, each configuration at two of them
REAL = [
    ("chain", CHAIN, "T=0.7"),
    ("chain", CHAIN, "T=1.0 top-p 0.9"),
    ("tree", REAL_TREE, "T=1.0"),
    ("tree", REAL_TREE, "T=0.7 top-k 5"),
]
REAL_SETTINGS = dict(max_model_len=4096, max_num_seqs=64)  # = test_real_exactness.SETTINGS: one shared tree engine


def histograms(samples: list[tuple[int, ...]]) -> dict[str, Counter]:
    hists = {f"token {i}": Counter(s[i] for s in samples) for i in range(TOKENS)}
    hists.update({f"tokens {i},{i + 1}": Counter((s[i], s[i + 1]) for s in samples) for i in range(TOKENS - 1)})
    return hists


def sample(
    engine: Engine, prompt: list[int], name: str, seed_base: int, samples: int = SAMPLES, seeded: bool = True
) -> tuple[list[tuple[int, ...]], float]:
    """``samples`` continuations (each request its own seed, or none: the engine's global
    stream), submitted a few batches at a time (thousands of queued requests slow every engine
    step down); and the run's MAT."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    before = engine.metrics()
    chunk = 4 * int(engine.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)
    out: list[tuple[int, ...]] = []
    for start in range(0, samples, chunk):
        sps = [
            SamplingParams(max_tokens=TOKENS, ignore_eos=True, seed=seed_base + i if seeded else None, **SETTINGS[name])
            for i in range(start, min(samples, start + chunk))
        ]
        results = engine.llm.generate([TokensPrompt(prompt_token_ids=prompt)] * len(sps), sps, use_tqdm=False)
        out += [tuple(r.outputs[0].token_ids) for r in results]
    mat = mean_accepted_tokens(counter_delta(before, engine.metrics()))
    assert all(len(s) == TOKENS for s in out)
    print(f"{engine.spec}: {name}: {samples} samples in {time.perf_counter() - t0:.0f} s, MAT {mat:.2f}")
    return out, mat


def check(comparisons: list[tuple[str, object, float]]) -> None:
    failures = []
    for label, comparison, mat in comparisons:
        print(f"{label}: MAT {mat:.2f}\n{comparison.summary()}")
        if not comparison.passed:
            failures.append(f"{label}:\n{comparison.summary()}")
        if not mat > 1.0:
            failures.append(f"{label}: no draft accepted (MAT {mat:.3f}), the test proves nothing")
    assert not failures, "\n".join(failures)


def test_toy_sampling_matches_vllm(sharp_toy_model, engines):
    from support import cycle_prompt

    # The toy model mostly walks its successor cycles; a prompt that walks one holds the
    # n-grams the sampled continuation most likely takes.  97 = 3 cached blocks + 1 token.
    prompt = cycle_prompt(sharp_toy_model, 97)
    reference = engines.get(sharp_toy_model, None)
    ref = {name: sample(reference, prompt, name, 0)[0] for name in TOY_SETTINGS}
    comparisons = []
    for k, (mode, spec) in enumerate({"tree": TOY_TREE, "chain": CHAIN}.items(), start=1):
        engine = engines.get(sharp_toy_model, spec)
        for name in TOY_SETTINGS:
            got, mat = sample(engine, prompt, name, 10_000_000 * k)
            comparisons.append(
                (f"toy {mode} {name}", compare_samples(histograms(ref[name]), histograms(got), ALPHA), mat)
            )
    # requests without a seed: their walks sample each position by the inverse CDF (sampler_noise.py)
    engine = engines.get(sharp_toy_model, TOY_TREE)
    for name in UNSEEDED_SETTINGS:
        got, mat = sample(engine, prompt, name, 0, seeded=False)
        comparisons.append(
            (f"toy tree {name}, no seed", compare_samples(histograms(ref[name]), histograms(got), ALPHA), mat)
        )
    check(comparisons)


def exact_histograms(model: str, prompt: list[int], params: dict) -> tuple[dict[str, dict], list[set]]:
    """Plain sampling's exact P(token i) and P(tokens i, i+1), over the prefixes it enumerates;
    and, per length, the set of enumerated prefixes.

    Prefix by prefix, the model's next-token logits (Hugging Face, fp32; the prompt's KV computed
    once, the prefixes of one length in batches on top of it) are processed as vLLM's sampler
    does: temperature, then its top-k/top-p op.  Prefixes less likely than ``EXACT_FLOOR`` are
    not extended; a sample whose prefix was not enumerated is counted in the "other" cell (see
    :func:`observed_histograms`), whose expected mass is what the enumeration left out -- an
    exact partition, so the goodness-of-fit test stays valid."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

    def next_probs(logits: torch.Tensor) -> torch.Tensor:
        m = logits.shape[0]
        k = torch.full((m,), params["top_k"]) if "top_k" in params else None
        p = torch.full((m,), params["top_p"]) if "top_p" in params else None
        return apply_top_k_top_p(logits.float() / params["temperature"], k, p).softmax(-1)

    levels: list[dict[tuple, float]] = [{(): 1.0}]  # per length: enumerated prefix -> probability
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True)
        cache, first = out.past_key_values, out.logits[:, -1]
        for level in range(TOKENS):
            grown: dict[tuple, float] = {}
            extend = [q for q, w in levels[-1].items() if w > EXACT_FLOOR]
            for start in range(0, len(extend), EXACT_BATCH):
                batch = extend[start : start + EXACT_BATCH]
                if level == 0:
                    logits = first
                else:
                    kv = copy.deepcopy(cache)
                    kv.batch_repeat_interleave(len(batch))
                    logits = hf(torch.tensor(batch), past_key_values=kv, use_cache=True).logits[:, -1]
                for prefix, row in zip(batch, next_probs(logits)):
                    weight = levels[-1][prefix]
                    for token in torch.nonzero(row * weight > EXACT_FLOOR).flatten().tolist():
                        grown[prefix + (token,)] = weight * float(row[token])
            levels.append(grown)
    hists: dict[str, dict] = {}
    for i in range(TOKENS):
        h = hists[f"token {i}"] = {}
        for seq, prob in levels[i + 1].items():
            h[seq[i]] = h.get(seq[i], 0.0) + prob
    for i in range(TOKENS - 1):
        h = hists[f"tokens {i},{i + 1}"] = {}
        for seq, prob in levels[i + 2].items():
            h[seq[i : i + 2]] = h.get(seq[i : i + 2], 0.0) + prob
    return hists, [set(level) for level in levels]


def observed_histograms(samples: list[tuple[int, ...]], enumerated: list[set]) -> dict[str, Counter]:
    """:func:`histograms`, with every sample whose prefix (up to the counted tokens) the exact
    reference did not enumerate counted as ``OTHER`` -- a category outside its support."""
    hists = {
        f"token {i}": Counter(s[i] if s[: i + 1] in enumerated[i + 1] else OTHER for s in samples)
        for i in range(TOKENS)
    }
    hists.update(
        {
            f"tokens {i},{i + 1}": Counter(s[i : i + 2] if s[: i + 2] in enumerated[i + 2] else OTHER for s in samples)
            for i in range(TOKENS - 1)
        }
    )
    return hists


@pytest.mark.real_model
def test_real_model_sampling_matches_vllm(real_model, engines):
    prompt = real_prompt(real_model)
    comparisons = []
    for k, (mode, spec, name) in enumerate(REAL, start=1):
        got, mat = sample(engines.get(real_model, spec, **REAL_SETTINGS), prompt, name, 10_000_000 * k, REAL_SAMPLES)
        exact, enumerated = exact_histograms(real_model, prompt, SETTINGS[name])
        observed = observed_histograms(got, enumerated)
        comparisons.append((f"SmolLM2 {mode} {name}", compare_to_exact(observed, exact, ALPHA), mat))
    check(comparisons)
