"""Which requests are drafted for (engine/propose/eligibility.py): wherever vLLM's own ngram method drafts."""

import pytest

from vllm_lookahead.engine.propose.eligibility import chain_only, draft_blocker, is_greedy

SamplingParams = pytest.importorskip("vllm").SamplingParams


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=0.0),
        dict(temperature=0.7),
        dict(temperature=1.0, top_p=0.9, top_k=5, seed=3),
        dict(temperature=0.0, logprobs=2),
        dict(temperature=0.7, logprobs=-1),
        dict(temperature=0.8, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3),
        dict(temperature=0.0, allowed_token_ids=[1, 2]),
        dict(temperature=0.0, min_tokens=5),
        dict(temperature=0.6, bad_words=["foo bar"]),
        dict(temperature=0.7, n=3),
        dict(temperature=0.6, thinking_token_budget=32),  # drafted within the budget (thinking_budget.py)
    ],
)
def test_what_vllm_drafts_for_is_drafted(kwargs):
    assert draft_blocker(SamplingParams(max_tokens=10, **kwargs)) is None


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        (dict(min_p=0.1), "min_p"),
        (dict(logit_bias={5: 1.0}), "logit_bias"),
    ],
)
def test_what_vllm_refuses_with_speculation_is_served_undrafted(kwargs, reason):
    assert draft_blocker(SamplingParams(temperature=0.7, **kwargs)).label == reason


def test_pooling_and_the_chain_rule():
    from vllm.sampling_params import StructuredOutputsParams

    assert draft_blocker(None).label == "pooling"
    structured = SamplingParams(temperature=0.7, structured_outputs=StructuredOutputsParams(choice=["a", "b"]))
    assert draft_blocker(structured) is None and chain_only(structured)
    assert not chain_only(SamplingParams(temperature=0.7))
    assert is_greedy(SamplingParams(temperature=0.0)) and not is_greedy(SamplingParams(temperature=0.5))
