import pytest

from vllm_lookahead.engine.eligibility import draft_blocker

SamplingParams = pytest.importorskip("vllm").SamplingParams


def test_plain_greedy_is_drafted():
    assert draft_blocker(SamplingParams(temperature=0.0, max_tokens=10), 0) is None


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        (dict(temperature=0.7), "temperature"),
        (dict(temperature=0.0, logprobs=2), "logprobs"),
        (dict(temperature=0.0, repetition_penalty=1.2), "penalties"),
        (dict(temperature=0.0, logit_bias={5: 1.0}), "logit_bias"),
        (dict(temperature=0.0, allowed_token_ids=[1, 2]), "allowed_token_ids"),
        (dict(temperature=0.0, min_tokens=5), "min_tokens"),
    ],
)
def test_requests_that_change_the_argmax_are_not_drafted(kwargs, reason):
    assert reason in draft_blocker(SamplingParams(**kwargs), 0)


def test_min_tokens_blocks_only_until_reached():
    sp = SamplingParams(temperature=0.0, min_tokens=5)
    assert draft_blocker(sp, 4) is not None
    assert draft_blocker(sp, 5) is None


def test_structured_output_is_not_drafted():
    from vllm.sampling_params import StructuredOutputsParams

    sp = SamplingParams(temperature=0.0, structured_outputs=StructuredOutputsParams(choice=["a", "b"]))
    assert "structured" in draft_blocker(sp, 0)
