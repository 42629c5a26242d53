import pytest

from vllm_lookahead.config import LookaheadConfig, LookaheadConfigError


def test_defaults_and_draft_size():
    cfg = LookaheadConfig.from_user_dict({"method": "lookahead"})
    assert (cfg.window_size, cfg.ngram_size, cfg.guess_set_size) == (7, 5, 7)
    assert cfg.max_lead_tokens == 32
    assert cfg.max_draft_tokens == 7 * 4 - 1 + 6 * 4 + 32  # the lead candidate may grow to 32
    assert LookaheadConfig.from_user_dict({"max_lead_tokens": 0}).max_draft_tokens == 7 * 4 - 1 + 7 * 4


@pytest.mark.parametrize(
    "spec,needles",
    [
        ({"window_size": 0}, ["window_size", "0", "[1, 64]"]),
        ({"ngram_size": 1}, ["ngram_size", "1", "[2, 16]"]),
        ({"guess_set_size": -3}, ["guess_set_size", "-3", "[0, 64]"]),
        ({"window_size": "7"}, ["window_size", "'7'"]),
        ({"window_shift": "two"}, ["window_shift", "'two'", "'one', 'accepted'"]),
        ({"windowsize": 7}, ["unknown field 'windowsize'", "window_size"]),
        ({"num_speculative_tokens": 5}, ["num_speculative_tokens"]),
    ],
)
def test_bad_values_name_field_value_and_range(spec, needles):
    with pytest.raises(LookaheadConfigError) as err:
        LookaheadConfig.from_user_dict({"method": "lookahead", **spec})
    for needle in needles:
        assert needle in str(err.value)


def test_translate_to_vllm_custom_class():
    from vllm_lookahead.engine.config_hook import PROPOSER_PATH, translate

    spec, extra, cfg = translate({"method": "lookahead", "window_size": 3, "ngram_size": 2, "guess_set_size": 0}, {"x": 1})
    assert spec == {"method": "custom_class", "model": PROPOSER_PATH, "num_speculative_tokens": 2}
    assert extra["x"] == 1 and extra["lookahead"]["window_size"] == 3
    assert LookaheadConfig.model_validate(extra["lookahead"]) == cfg


def test_step_cap_auto_per_platform_and_explicit():
    from vllm_lookahead.config import AUTO_TOKENS_PER_STEP, FIELD_RANGES

    auto = LookaheadConfig.from_user_dict({"method": "lookahead"})
    assert auto.max_tokens_per_step == "auto"
    assert auto.tokens_per_step_cap("cpu") == AUTO_TOKENS_PER_STEP["cpu"] > 0
    assert auto.tokens_per_step_cap("cuda") == 0  # no cap where it has not been measured
    assert auto.draft_limit_per_request("cpu") == auto.max_lead_tokens  # one candidate chain
    assert LookaheadConfig.from_user_dict({"max_lead_tokens": 0}).draft_limit_per_request("cpu") == 4
    assert auto.draft_limit_per_request("cuda") is None
    assert LookaheadConfig.from_user_dict({"max_tokens_per_step": 24}).draft_limit_per_request("cpu") is None
    assert LookaheadConfig.from_user_dict({"max_tokens_per_step": 0}).tokens_per_step_cap("cpu") == 0
    assert LookaheadConfig.from_user_dict({"max_tokens_per_step": 40}).tokens_per_step_cap("cuda") == 40
    assert set(FIELD_RANGES) == set(LookaheadConfig.model_fields)
    for bad in (-1, 70000, "x", 1.5, True):
        with pytest.raises(LookaheadConfigError, match="max_tokens_per_step"):
            LookaheadConfig.from_user_dict({"max_tokens_per_step": bad})
    with pytest.raises(LookaheadConfigError, match=r"lookup_context' = 0 .*\[1, 8\]"):
        LookaheadConfig.from_user_dict({"lookup_context": 0})
    assert LookaheadConfig.from_user_dict({"lookup_context": 3}).core_params.lookup_context == 3


def test_shipped_configs_are_valid():
    import json
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.json"))
    assert files
    for f in files:
        spec = json.loads(f.read_text())
        assert spec["method"] == "lookahead"
        LookaheadConfig.from_user_dict(spec)
