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
        ({"window_size": 65}, ["window_size", "65", "[0, 64]"]),
        ({"window_size": 0, "guess_set_size": 0}, ["window_size and guess_set_size are both 0"]),
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
    pytest.importorskip("vllm")
    from vllm_lookahead.engine.startup import PROPOSER_PATH, translate

    spec, extra, cfg = translate({"method": "lookahead", "window_size": 3, "ngram_size": 2, "guess_set_size": 0}, {"x": 1})
    assert spec == {"method": "custom_class", "model": PROPOSER_PATH, "num_speculative_tokens": 2,
                    "num_speculative_tokens_per_batch_size": [(1, 1 << 20, 2)]}
    assert extra["x"] == 1 and extra["lookahead"]["window_size"] == 3
    assert LookaheadConfig.model_validate(extra["lookahead"]) == cfg


def test_step_cap_auto_is_the_cost_rule_numbers_are_fixed_caps():
    auto = LookaheadConfig.from_user_dict({"method": "lookahead"})
    assert auto.max_tokens_per_step == "auto" and auto.cost_rule
    assert auto.draft_budget(1) is None and auto.draft_budget(32) is None  # the rule decides, per step
    full = LookaheadConfig.from_user_dict({"max_tokens_per_step": 0})
    assert not full.cost_rule and full.draft_budget(8) is None  # full trees, no cap
    capped = LookaheadConfig.from_user_dict({"max_tokens_per_step": 40})
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


def test_ranges_are_read_off_the_fields_and_the_readme_states_them():
    """One declaration per range (the pydantic field); messages and the README table follow it."""
    import re
    from pathlib import Path

    from vllm_lookahead.config import field_range

    assert field_range("window_size") == "an integer in [0, 64]"
    assert field_range("window_shift") == "one of 'one', 'accepted'"
    assert field_range("max_tokens_per_step") == "'auto' or an integer in [0, 65536]"

    def in_readme_notation(words: str) -> str:  # "an integer in [1, 64]" -> "1..64", ...
        words = re.sub(r"an integer in \[(-?\d+), (-?\d+)\]", r"\1..\2", words)
        words = words.replace("true or false", "bool").replace("one of ", "").replace(" or ", ", ")
        return re.sub(r"'(\w+)'", r'`"\1"`', words)

    def default_in_readme_notation(value) -> str:
        return str(value).lower() if isinstance(value, bool) else f'`"{value}"`' if isinstance(value, str) else str(value)

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|", readme, re.M)}
    assert set(rows) == set(LookaheadConfig.model_fields), "README parameter table: fields differ from the config"
    for name, info in LookaheadConfig.model_fields.items():
        assert rows[name] == (default_in_readme_notation(info.default), in_readme_notation(field_range(name))), name
