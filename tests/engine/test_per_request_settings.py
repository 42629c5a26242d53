"""Per-request lookahead settings (``SamplingParams.extra_args``, engine/propose/request_overrides.py) in a
running engine: requests turned off or shrunk beside default ones -- greedy, seeded and unseeded
sampled -- return vLLM's tokens without speculation; a bad value is a ValueError naming the key,
raised before the request reaches the engine, which serves on.

The (sharp) toy engine with full trees that test_toy_sampling_features.py shares (``engines``);
per-request draft counts and the HTTP 400 are checked at the OpenAI server (test_bad_requests.py).
"""

from __future__ import annotations

import pytest
from harness import TOY_TREE, compare, counter_delta
from test_toy_sampling_features import MIXED, _prompts

pytestmark = pytest.mark.engine

TREE = TOY_TREE  # W=3, N=4, G=5, max_lead_tokens 8, full trees every step
MAX_TOKENS = 40

# one per prompt of a batch of 8: off, shrunk, reshaped, and default requests side by side
GREEDY = (
    None,
    {"lookahead": "off"},
    {"lookahead_window_size": 0},
    {"lookahead_max_lead_tokens": 0, "lookahead_guess_set_size": 1},
    {"lookahead": "on", "lookahead_guess_set_size": 2},
    {"lookahead": "off", "lookahead_window_size": 1},
    {"lookahead_window_size": 2, "lookahead_max_lead_tokens": 4},
    None,
)
# beside MIXED's sampling parameters (test_toy_sampling_features.py): seeded requests 1, 4, 6 and 7
# carry settings, 3 is a default seeded one
SAMPLED = (
    None,  # greedy
    {"lookahead": "off"},  # seed 11
    {"lookahead_max_lead_tokens": 2},  # unseeded
    None,  # seed 12
    {"lookahead_window_size": 1, "lookahead_guess_set_size": 1},  # seed 13, logprobs
    {"lookahead_window_size": 0},  # greedy with a presence penalty
    {"lookahead_window_size": 0, "lookahead_max_lead_tokens": 0},  # seed 14, min_tokens
    {"lookahead_guess_set_size": 0},  # seed 15, bad words
)


def _with(settings: tuple, params: tuple[dict, ...] | None = None) -> tuple[dict, ...]:
    params = params or ({},) * len(settings)
    return tuple({**p, **({"extra_args": dict(s)} if s else {})} for p, s in zip(params, settings))


def test_requests_turned_off_or_shrunk_beside_default_ones_are_exact(sharp_toy_model, baselines, engines):
    prompts = _prompts(sharp_toy_model)
    want = baselines.get(sharp_toy_model, {}, prompts, MAX_TOKENS, batch=8)
    engine = engines.get(sharp_toy_model, TREE)
    before = engine.metrics()
    got = engine.generate(prompts, MAX_TOKENS, batch=8, per_prompt=_with(GREEDY))
    mixed = counter_delta(before, engine.metrics())
    report, failures = compare(want, got, "per-request settings")
    assert not failures, report
    assert mixed.get("vllm:spec_decode_num_accepted_tokens", 0) > 0  # the default and shrunk ones drafted
    # the same batch with every request off: not one draft, the same tokens
    before = engine.metrics()
    off = engine.generate(prompts, MAX_TOKENS, batch=8, per_prompt=({"extra_args": {"lookahead": "off"}},))
    delta = counter_delta(before, engine.metrics())
    assert delta.get("vllm:spec_decode_num_drafts", 0) == 0 and delta.get("vllm:generation_tokens", 0) > 0
    assert [c.tokens for c in off] == [c.tokens for c in got]


def test_seeded_sampled_requests_with_settings_return_vllms_tokens(sharp_toy_model, baselines, engines):
    prompts = _prompts(sharp_toy_model)
    want = baselines.get(sharp_toy_model, {}, prompts, MAX_TOKENS, batch=8, per_prompt=MIXED)  # extra_args: none
    engine = engines.get(sharp_toy_model, TREE)
    per_prompt = _with(SAMPLED, MIXED)
    before = engine.metrics()
    first = engine.generate(prompts, MAX_TOKENS, batch=8, per_prompt=per_prompt)
    second = engine.generate(prompts, MAX_TOKENS, batch=8, per_prompt=per_prompt)
    metrics = counter_delta(before, engine.metrics())
    assert metrics.get("vllm:spec_decode_num_accepted_tokens", 0) > 0
    seeded = 0
    for i, params in enumerate(MIXED):
        if params.get("temperature", 0.0) == 0.0:
            report, failures = compare([want[i]], [first[i]], f"greedy prompt {i}")
            assert not failures, report
        if "seed" in params:
            assert first[i].tokens == want[i].tokens == second[i].tokens, (i, params, SAMPLED[i])
            seeded += 1
        if "min_tokens" in params:
            assert len(first[i].tokens) >= params["min_tokens"]
    assert seeded == 5


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"lookahead_max_lead_tokens": -3}, "max_lead_tokens must be an integer in [0, 256]"),
        ({"lookahead_window_size": 4}, "above this engine's window_size 3"),
        ({"lookahead_ngram_size": 3}, "ngram_size is set for the whole engine"),
        ({"lookahead_windowsize": 1}, "unknown lookahead key 'lookahead_windowsize'"),
        ({"lookahead": "sometimes"}, "'lookahead' = 'sometimes' is invalid"),
    ],
    ids=["range", "above-the-engine", "per-engine", "unknown", "switch"],
)
def test_a_bad_setting_is_a_value_error_naming_the_key_and_the_engine_serves_on(
    sharp_toy_model, engines, extra, needle
):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = engines.get(sharp_toy_model, TREE)
    prompt = TokensPrompt(prompt_token_ids=_prompts(sharp_toy_model)[0])
    params = [
        SamplingParams(temperature=0, max_tokens=4),
        SamplingParams(temperature=0, max_tokens=4, extra_args=extra),
    ]
    with pytest.raises(ValueError) as info:
        engine.llm.generate([prompt, prompt], params, use_tqdm=False)
    assert needle in str(info.value)
    assert engine.llm.llm_engine.get_num_unfinished_requests() == 0  # the call's first request was aborted
    (out,) = engine.llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=8, extra_args={"lookahead": "on"}), use_tqdm=False
    )
    assert len(out.outputs[0].token_ids) == 8
