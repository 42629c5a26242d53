"""Edge cases of a request's length and end, lookahead (branching trees with the window) against the
same engine settings without speculation, token by token: a prompt one token short of
max_model_len, max_tokens 1 and 2, EOS as the very first token, a generation far past the
window's warm-up."""

from __future__ import annotations

import pytest
from harness import TOY_TREE, compare, counter_delta, specbench_questions

pytestmark = pytest.mark.engine

MAX_MODEL_LEN = 2048  # harness.ENGINE_DEFAULTS


def _prompts(model: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return [tokenizer.encode(q["turns"][0])[: 10 + 7 * i] for i, q in enumerate(specbench_questions(limit=count))]


def _long_prompt(model: str) -> list[int]:
    return (sum(_prompts(model, 24), []) * 40)[: MAX_MODEL_LEN - 1]


def _eos(model: str) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model).eos_token_id


@pytest.fixture(scope="module", autouse=True)
def _baselines_first(toy_model, baselines):
    """Every case's no-speculation run in one engine, before the lookahead engine starts."""
    baselines.prefetch(
        toy_model,
        {},
        [
            ([_long_prompt(toy_model)], 8, 1, {}),
            *((_prompts(toy_model, 8), n, 8, {}) for n in (1, 2)),
            (_prompts(toy_model, 4), 16, 4, {"allowed_token_ids": [_eos(toy_model)]}),
            (_prompts(toy_model, 2), 400, 2, {}),
        ],
    )


def _same(baselines, engines, model, prompts, max_tokens, batch, **params):
    expected = baselines.get(model, {}, prompts, max_tokens, batch=batch, **params)
    engine = engines.get(model, TOY_TREE)
    before = engine.metrics()
    got = engine.generate(prompts, max_tokens, batch=batch, **params)
    _, failures = compare(expected, got, f"max_tokens={max_tokens} {params}")
    assert not failures, failures
    return expected, got, counter_delta(before, engine.metrics())


def test_prompt_one_token_short_of_max_model_len(toy_model, engines, baselines):
    expected, got, _ = _same(baselines, engines, toy_model, [_long_prompt(toy_model)], 8, batch=1)
    assert len(got[0].tokens) == 1  # the one position left


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_max_tokens_one_and_two(toy_model, engines, baselines, max_tokens):
    prompts = _prompts(toy_model, 8)
    _, got, delta = _same(baselines, engines, toy_model, prompts, max_tokens, batch=8)
    assert all(len(c.tokens) == max_tokens for c in got)
    # a draft needs a step after the first token and room before max_tokens: none at 1
    if max_tokens == 1:
        assert delta.get("vllm:spec_decode_num_drafts", 0) == 0


def test_eos_as_the_first_token(toy_model, engines, baselines):
    eos = _eos(toy_model)
    prompts = _prompts(toy_model, 4)
    _, got, _ = _same(baselines, engines, toy_model, prompts, 16, batch=4, allowed_token_ids=[eos])
    assert all(c.tokens == [eos] for c in got)


def test_generation_far_past_the_window_warm_up(toy_model, engines, baselines):
    prompts = _prompts(toy_model, 2)
    _, got, delta = _same(baselines, engines, toy_model, prompts, 400, batch=2)
    assert all(len(c.tokens) == 400 for c in got)
    assert delta.get("vllm:spec_decode_num_accepted_tokens", 0) > 0
