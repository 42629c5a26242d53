import pytest

from vllm_lookahead.config import LookaheadConfig, LookaheadConfigError


def test_defaults_and_draft_size():
    cfg = LookaheadConfig.from_user_dict({"method": "lookahead"})
    assert (cfg.window_size, cfg.ngram_size, cfg.guess_set_size) == (7, 5, 7)
    assert cfg.max_draft_tokens == 7 * 4 - 1 + 7 * 4


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
