import pytest

from vllm_lookahead.config import (
    ABLATION_KEY,
    REMOVED_KEYS,
    USER_KEYS,
    Ablation,
    DraftMode,
    LookaheadConfig,
    LookaheadConfigError,
    field_range,
    parameter_table,
)


def test_defaults_and_draft_size():
    cfg = LookaheadConfig.from_user_dict({"method": "lookahead"})
    assert cfg == LookaheadConfig()
    assert (cfg.window_size, cfg.ngram_size, cfg.guess_set_size) == (7, 5, 7)
    assert cfg.max_lead_tokens == 32
    assert cfg.max_draft_tokens == 7 * 4 - 1 + 6 * 4 + 32  # the lead candidate may grow to 32
    assert LookaheadConfig.from_user_dict({"max_lead_tokens": 0}).max_draft_tokens == 7 * 4 - 1 + 7 * 4


def test_the_user_surface_is_eight_keys():
    assert USER_KEYS == (
        "window_size",
        "ngram_size",
        "guess_set_size",
        "max_lead_tokens",
        "lookup_context",
        "shared_pool",
        "max_pool_keys",
        "max_tokens_per_step",
    )


@pytest.mark.parametrize(
    "spec,needles",
    [
        ({"window_size": 65}, ["window_size", "65", "[0, 64]"]),
        ({"window_size": 0, "guess_set_size": 0}, ["window_size and guess_set_size are both 0"]),
        ({"ngram_size": 1}, ["ngram_size", "1", "[2, 16]"]),
        ({"guess_set_size": -3}, ["guess_set_size", "-3", "[0, 64]"]),
        ({"window_size": "7"}, ["window_size", "'7'"]),
        ({"windowsize": 7}, ["unknown field 'windowsize'", "valid fields: method, window_size"]),
        ({"ablation": {"seed": 1}}, ["unknown field 'ablation'", "max_tokens_per_step"]),
        ({"num_speculative_tokens": 5}, ["num_speculative_tokens", "is not accepted"]),
        ({"measure_drafting": True}, ["'measure_drafting' was removed"]),
        ({"price_host_work": False}, ["'price_host_work' was removed"]),
        ({"price_verification": True}, ["'price_verification' was removed"]),
        ({"rest_idle_requests": True}, ["'rest_idle_requests' was removed"]),
        ({"merge_candidates": False}, ["'merge_candidates' was removed"]),
        ({"window_shift": "one"}, ["'window_shift' was removed"]),
        ({"seed": 3}, ["'seed' was removed"]),
    ],
)
def test_bad_values_name_field_value_and_range(spec, needles):
    with pytest.raises(LookaheadConfigError) as err:
        LookaheadConfig.from_user_dict({"method": "lookahead", **spec})
    for needle in needles:
        assert needle in str(err.value)


def test_every_removed_key_is_named_and_none_is_a_user_key():
    assert set(Ablation.model_fields) <= set(REMOVED_KEYS)
    assert not set(REMOVED_KEYS) & set(USER_KEYS)


def test_ablation_settings_come_beside_the_users_config():
    cfg = LookaheadConfig.from_user_dict({"window_size": 3}, ablation={"merge_candidates": False, "seed": 4})
    assert cfg.window_size == 3 and cfg.ablation == Ablation(merge_candidates=False, seed=4)
    assert "ablation {'merge_candidates': False, 'seed': 4}" in cfg.summary()
    assert "ablation" not in LookaheadConfig().summary()
    with pytest.raises(LookaheadConfigError, match=ABLATION_KEY):
        LookaheadConfig.from_user_dict({}, ablation={"window_shift": "two"})
    with pytest.raises(LookaheadConfigError, match=ABLATION_KEY):
        LookaheadConfig.from_user_dict({}, ablation={"window_size": 3})  # a user key is not an ablation


def test_translate_to_vllm_custom_class():
    pytest.importorskip("vllm")
    from vllm_lookahead.engine.hooks.startup import PROPOSER_PATH, translate

    spec, extra, cfg = translate(
        {"method": "lookahead", "window_size": 3, "ngram_size": 2, "guess_set_size": 0}, {"x": 1}
    )
    assert spec == {
        "method": "custom_class",
        "model": PROPOSER_PATH,
        "num_speculative_tokens": 2,
        "num_speculative_tokens_per_batch_size": [(1, 1 << 20, 2)],
    }
    assert extra["x"] == 1 and extra["lookahead"]["window_size"] == 3
    assert LookaheadConfig.model_validate(extra["lookahead"]) == cfg
    _, extra, cfg = translate({"method": "lookahead"}, {ABLATION_KEY: {"pool_from_prompt": False}})
    assert ABLATION_KEY not in extra and not cfg.ablation.pool_from_prompt
    assert LookaheadConfig.model_validate(extra["lookahead"], strict=False) == cfg


def test_one_mode_decided_once_from_max_tokens_per_step():
    auto = LookaheadConfig.from_user_dict({"method": "lookahead"})
    assert auto.max_tokens_per_step == "auto" and auto.mode is DraftMode.AUTO
    assert auto.draft_budget(1) is None and auto.draft_budget(32) is None  # the rule decides, per step
    full = LookaheadConfig.from_user_dict({"max_tokens_per_step": 0})
    assert full.mode is DraftMode.FULL and full.draft_budget(8) is None  # full trees, no cap
    capped = LookaheadConfig.from_user_dict({"max_tokens_per_step": 40})
    assert capped.mode is DraftMode.CAP
    assert [capped.draft_budget(n) for n in (1, 8, 40, 41)] == [39, 4, 0, 0]
    for bad in (-1, 70000, "x", 1.5, True):
        with pytest.raises(LookaheadConfigError, match="max_tokens_per_step"):
            LookaheadConfig.from_user_dict({"max_tokens_per_step": bad})
    with pytest.raises(LookaheadConfigError, match=r"lookup_context' = 0 .*\[1, 8\]"):
        LookaheadConfig.from_user_dict({"lookup_context": 0})


def test_shipped_configs_are_valid():
    import json
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.json"))
    assert files
    for f in files:
        spec = json.loads(f.read_text())
        assert spec["method"] == "lookahead"
        LookaheadConfig.from_user_dict(spec)


def test_ranges_are_read_off_the_fields_and_the_readme_table_is_generated_from_them():
    """One declaration per range (the pydantic field); messages and the README table follow it."""
    from pathlib import Path

    assert field_range("window_size") == "an integer in [0, 64]"
    assert field_range("window_shift") == "one of 'one', 'accepted'"
    assert field_range("max_tokens_per_step") == "'auto' or an integer in [0, 65536]"

    table = parameter_table()
    assert [line.split("`")[1] for line in table.splitlines()[2:]] == list(USER_KEYS)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert table in readme, "README parameter table: regenerate it with vllm_lookahead.config.parameter_table()"
