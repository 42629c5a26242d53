"""Per-request lookahead settings in ``SamplingParams.extra_args`` (engine/propose/request_overrides.py):
parsing, errors that name the key, the keys a request may not set, the front-end check vLLM's
input processor runs, and the worker building each request's state from them."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402

from vllm_lookahead.config import USER_KEYS, LookaheadConfig, field_range  # noqa: E402
from vllm_lookahead.engine.propose import eligibility, request_overrides  # noqa: E402
from vllm_lookahead.engine.propose.request_overrides import (  # noqa: E402
    PER_ENGINE,
    PER_REQUEST,
    RequestOverrideError,
    check_request,
    for_request,
    parse,
    turned_off,
)

ENGINE = LookaheadConfig()  # the shipped defaults: W=7, N=5, G=7, max_lead_tokens=32, no shared pool


def _refused(extra: dict, engine: LookaheadConfig = ENGINE) -> RequestOverrideError:
    with pytest.raises(RequestOverrideError) as info:
        parse(extra, engine)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, VLLMValidationError)  # LLM.generate / HTTP 400
    return err


# -- which keys -------------------------------------------------------------------------


def test_every_config_key_is_either_per_request_or_per_engine():
    assert set(PER_REQUEST) | set(PER_ENGINE) == set(USER_KEYS)
    assert not set(PER_REQUEST) & set(PER_ENGINE)
    assert PER_REQUEST == ("window_size", "guess_set_size", "max_lead_tokens")  # the three size limits


def test_requests_without_lookahead_keys_have_no_settings():
    assert parse(None, ENGINE) is None
    assert parse({}, ENGINE) is None
    assert parse({"kv_transfer_params": {"x": 1}, "lookaheadx": 3, "my_plugin_key": "off"}, ENGINE) is None


# -- "lookahead": on / off --------------------------------------------------------------


@pytest.mark.parametrize(
    "value,enabled",
    [
        ("off", False),
        ("OFF", False),
        (" Off ", False),
        (False, False),
        (0, False),
        ("on", True),
        ("On", True),
        (True, True),
        (1, True),
    ],
)
def test_the_switch(value, enabled):
    settings = parse({"lookahead": value}, ENGINE)
    assert settings.enabled is enabled and settings.config == ENGINE and settings.keys == ()
    assert turned_off(SamplingParams(extra_args={"lookahead": value})) is (not enabled)


@pytest.mark.parametrize("value", ["maybe", "", 2, 0.5, ["off"], {"window_size": 0}])
def test_a_bad_switch_value_names_the_key(value):
    err = _refused({"lookahead": value})
    assert err.parameter == "lookahead" and "'lookahead'" in str(err) and "'on' or 'off'" in str(err)
    assert not turned_off(SamplingParams(extra_args={"lookahead": value}))  # the worker never stops on it


def test_off_is_a_reason_not_to_draft_with_its_own_metric_label():
    reason = eligibility.draft_blocker(SamplingParams(temperature=0.7, extra_args={"lookahead": "off"}))
    assert reason is eligibility.Undrafted.REQUEST and reason.label == "request" and reason.client_choice
    assert "request" in eligibility.UNDRAFTED_REASONS
    assert eligibility.draft_blocker(SamplingParams(extra_args={"lookahead": "on"})) is None
    assert eligibility.draft_blocker(SamplingParams(extra_args={"other": "off"})) is None


# -- lookahead_<key> --------------------------------------------------------------------


def test_keys_replace_the_engines_values():
    settings = parse(
        {"lookahead_window_size": 0, "lookahead_max_lead_tokens": 8, "lookahead_guess_set_size": 3, "other": 1}, ENGINE
    )
    cfg = settings.config
    assert settings.enabled
    assert (cfg.window_size, cfg.max_lead_tokens, cfg.guess_set_size) == (0, 8, 3)
    # the per-engine keys stay the engine's
    assert (cfg.ngram_size, cfg.lookup_context, cfg.max_pool_keys, cfg.max_tokens_per_step) == (5, 3, 65536, "auto")
    assert cfg.shared_pool is False and cfg.ablation == ENGINE.ablation
    assert set(settings.keys) == {"window_size", "max_lead_tokens", "guess_set_size"}


@pytest.mark.parametrize(
    "key,value",
    [
        ("lookahead_max_lead_tokens", -3),
        ("lookahead_max_lead_tokens", 257),
        ("lookahead_window_size", 65),
        ("lookahead_window_size", -1),
        ("lookahead_window_size", 2.5),
        ("lookahead_window_size", "3"),
        ("lookahead_window_size", True),
        ("lookahead_guess_set_size", [1, 2]),
    ],
)
def test_a_bad_value_names_the_key_and_the_range_of_the_config_model(key, value):
    err = _refused({key: value})
    name = key.removeprefix("lookahead_")
    assert err.parameter == key
    assert f"{key} = {value!r} is invalid: {name} must be {field_range(name)}" in str(err)


def test_the_example_value():
    err = _refused({"lookahead_max_lead_tokens": -3})
    assert "max_lead_tokens must be an integer in [0, 256]" in str(err)


def test_unknown_keys_are_errors():
    err = _refused({"lookahead_windowsize": 3})
    assert err.parameter == "lookahead_windowsize" and "unknown lookahead key 'lookahead_windowsize'" in str(err)
    assert "lookahead_window_size" in str(err)  # the valid keys are listed
    assert _refused({"lookahead_method": "ngram"}).parameter == "lookahead_method"
    for removed in ("lookahead_pool_from_prompt", "lookahead_merge_candidates", "lookahead_seed"):  # not user keys
        assert "unknown lookahead key" in str(_refused({removed: False}))


@pytest.mark.parametrize("name", sorted(PER_ENGINE))
def test_per_engine_keys_are_refused_saying_so(name):
    value = getattr(ENGINE, name)  # even the engine's own value: the key is not a request's to set
    err = _refused({f"lookahead_{name}": value})
    assert err.parameter == f"lookahead_{name}"
    assert f"{name} is set for the whole engine at start" in str(err) and PER_ENGINE[name] in str(err)


@pytest.mark.parametrize("name", PER_REQUEST)
def test_sizes_may_be_lowered_not_raised(name):
    engine = LookaheadConfig(window_size=3, guess_set_size=4, max_lead_tokens=8)
    limit = getattr(engine, name)
    assert getattr(parse({f"lookahead_{name}": limit}, engine).config, name) == limit
    assert getattr(parse({f"lookahead_{name}": 1}, engine).config, name) == 1
    err = _refused({f"lookahead_{name}": limit + 1}, engine)
    assert err.parameter == f"lookahead_{name}"
    assert f"is above this engine's {name} {limit}" in str(err)


def test_a_request_may_drop_the_window_but_not_draft_nothing():
    assert parse({"lookahead_window_size": 0}, ENGINE).config.window_size == 0
    assert parse({"lookahead_guess_set_size": 0}, ENGINE).config.guess_set_size == 0
    err = _refused({"lookahead_window_size": 0, "lookahead_guess_set_size": 0})
    assert "window_size and guess_set_size are both 0" in str(err) and "'off'" in str(err)  # the config's own rule
    assert err.parameter == "lookahead_window_size"
    window_only = LookaheadConfig(guess_set_size=0)
    assert _refused({"lookahead_window_size": 0}, window_only).parameter == "lookahead_window_size"


def test_keys_are_validated_when_the_request_turns_lookahead_off():
    assert parse({"lookahead": "off", "lookahead_window_size": 2}, ENGINE).enabled is False
    assert _refused({"lookahead": "off", "lookahead_max_lead_tokens": -3}).parameter == "lookahead_max_lead_tokens"


# -- the front end: vLLM's input processor -----------------------------------------------


def _vllm_config(spec: dict | None):
    """The parts of a VllmConfig the front-end check reads (as startup.translate leaves them)."""
    from vllm_lookahead.engine.hooks.startup import translate

    if spec is None:
        return SimpleNamespace(speculative_config=None, additional_config={})
    vllm_spec, extra, _ = translate(spec, None)
    return SimpleNamespace(speculative_config=SimpleNamespace(**vllm_spec), additional_config=extra)


def test_the_front_end_checks_against_the_engines_config():
    small = _vllm_config({"method": "lookahead", "window_size": 2})
    check_request(small, SamplingParams(extra_args={"lookahead_window_size": 2, "lookahead": "on"}))
    check_request(small, SamplingParams())
    check_request(small, SamplingParams(extra_args={"unrelated": 1}))
    with pytest.raises(RequestOverrideError, match="above this engine's window_size 2"):
        check_request(small, SamplingParams(extra_args={"lookahead_window_size": 3}))
    with pytest.raises(RequestOverrideError, match="max_lead_tokens"):
        check_request(small, SamplingParams(extra_args={"lookahead_max_lead_tokens": -3}))
    # an engine without lookahead leaves the keys alone, as vLLM leaves extra_args nobody reads
    check_request(_vllm_config(None), SamplingParams(extra_args={"lookahead_max_lead_tokens": -3}))
    check_request(
        SimpleNamespace(speculative_config=SimpleNamespace(method="ngram", model=None)),
        SamplingParams(extra_args={"lookahead": "maybe"}),
    )


def test_the_patch_wraps_vllms_params_validation():
    """The table's entry replaces InputProcessor._validate_params (vLLM: a ValueError there is a
    400 at the OpenAI server); its replacement runs vLLM's checks first, then the request's keys."""
    from vllm_lookahead.engine.hooks.patches import PATCHES, _validate_params

    (patch,) = [p for p in PATCHES if p.make is _validate_params]
    assert patch.target == "vllm.v1.engine.input_processor:InputProcessor._validate_params"
    calls = []
    replacement = _validate_params(lambda self, params, tasks: calls.append(tasks) or "watermarking")
    proc = SimpleNamespace(vllm_config=_vllm_config({"method": "lookahead"}))
    assert replacement(proc, SamplingParams(extra_args={"lookahead": "off"}), ("generate",)) == "watermarking"
    with pytest.raises(RequestOverrideError, match="lookahead_max_lead_tokens = -3"):
        replacement(proc, SamplingParams(extra_args={"lookahead_max_lead_tokens": -3}), ("generate",))
    assert calls == [("generate",), ("generate",)]


# -- the worker: each request's state ------------------------------------------------------


def _proposer(**keys):
    """The proposer vLLM would build over a stand-in runner (as in test_runner_propose.py)."""
    from vllm_lookahead.engine.hooks.proposer import LookaheadProposer
    from vllm_lookahead.engine.runner import RunnerLookahead

    model = SimpleNamespace(max_model_len=4096, uses_mrope=False)
    vllm_config = SimpleNamespace(
        additional_config={"lookahead": keys}, model_config=model, device_config=SimpleNamespace(device_type="cpu")
    )
    proposer = LookaheadProposer(vllm_config)
    runner = SimpleNamespace(
        vllm_config=vllm_config,
        model_config=model,
        drafter=proposer,
        input_batch=SimpleNamespace(req_ids=[]),
        requests={},
    )
    RunnerLookahead.of(runner)
    return proposer


def _step(p, requests: dict[str, tuple[list[int], dict | None]]) -> dict[str, list[int]]:
    """One propose call for requests ``{id: (history, extra_args)}`` (history ends with the new token)."""
    runner = p.owner.runner
    runner.input_batch.req_ids = list(requests)
    for r, (history, extra) in requests.items():
        if r not in runner.requests:
            sp = SamplingParams(temperature=0.0, max_tokens=1000, extra_args=extra)
            runner.requests[r] = SimpleNamespace(prompt_token_ids=history[:-1], sampling_params=sp, output_token_ids=[])
    width = max(len(h) for h, _ in requests.values())
    ids = np.zeros((len(requests), width), dtype=np.int64)
    for i, (h, _) in enumerate(requests.values()):
        ids[i, : len(h)] = h
    drafts = p.propose([[h[-1]] for h, _ in requests.values()], np.array([len(h) for h, _ in requests.values()]), ids)
    return dict(zip(requests, drafts))


def test_off_gets_no_draft_and_no_work_beside_requests_that_draft():
    p = _proposer(max_tokens_per_step=0, ngram_size=3, guess_set_size=2, window_size=2)
    text = [1, 2, 3, 4, 5, 6] * 4
    drafts = _step(
        p, {"a": (text + [1], None), "off": (text + [1], {"lookahead": "off"}), "b": (text + [1], {"lookahead": "on"})}
    )
    assert drafts["off"] == [] and drafts["a"] and drafts["b"] == drafts["a"]
    assert p.owner.report.undrafted == {"off": "request"}
    off = p.owner.live.state("off")
    assert off.window is None and off.text.pool_ngrams == 0 and off.text.shared is None  # learns nothing
    assert p.owner.live.state("a").window is not None


def test_the_worker_builds_each_state_from_its_request():
    p = _proposer(max_tokens_per_step=0, ngram_size=3, guess_set_size=2, window_size=2, shared_pool=True)
    text = [1, 2, 3, 4, 5, 6] * 4
    drafts = _step(
        p,
        {
            "default": (text + [1], None),
            "no_window": (text + [1], {"lookahead_window_size": 0}),
            "short_lead": (
                text + [1],
                {"lookahead_max_lead_tokens": 1, "lookahead_guess_set_size": 1, "lookahead_window_size": 0},
            ),
        },
    )
    states = {r: p.owner.live.state(r) for r in ("default", "no_window", "short_lead")}
    assert states["default"].config is p.owner.config and states["default"].text.shared is p.owner.shared is not None
    assert states["no_window"].window is None and states["no_window"].config.window_size == 0
    assert states["short_lead"].text.shared is p.owner.shared  # the engine's shared pool for every request
    assert len(drafts["short_lead"]) < len(drafts["default"])
    # the prompt's n-grams draft for the default request
    assert drafts["default"] and drafts["no_window"]
    assert len(drafts["no_window"]) < len(drafts["default"])  # candidates only, no window columns


def test_keys_that_reach_the_worker_unchecked_never_stop_it(caplog):
    """A request that bypassed vLLM's input processor: the worker drafts it under the engine's
    config and says why."""
    p = _proposer(max_tokens_per_step=0, ngram_size=3, guess_set_size=2, window_size=2)
    text = [1, 2, 3, 4, 5, 6] * 4
    with caplog.at_level(logging.WARNING, logger="vllm.lookahead"):
        drafts = _step(
            p, {"bad": (text + [1], {"lookahead_window_size": 99}), "bad_switch": (text + [1], {"lookahead": "maybe"})}
        )
    assert drafts["bad"] and drafts["bad_switch"]
    assert p.owner.live.state("bad").config is p.owner.config
    assert any("lookahead_window_size = 99" in r.getMessage() for r in caplog.records)


def test_for_request_fast_path():
    shared = object()
    assert for_request(ENGINE, SamplingParams(), shared) == (ENGINE, shared)
    assert for_request(ENGINE, None, shared) == (ENGINE, shared)
    assert for_request(ENGINE, SamplingParams(extra_args={"x": 1}), shared) == (ENGINE, shared)
    cfg, pool = for_request(ENGINE, SamplingParams(extra_args={"lookahead": "off"}), shared)
    assert pool is None and cfg.window_size == 0
    assert not cfg.ablation.pool_from_prompt and not cfg.ablation.pool_from_output
    assert request_overrides.lookahead_entries({"lookahead": 1, "lookahead_x": 2, "y": 3}) == {
        "lookahead": 1,
        "lookahead_x": 2,
    }


def test_the_readme_lists_the_per_request_keys():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Per-request control", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r'"(lookahead_\w+)"', section.split("```", 1)[0]))
    assert listed == {f"lookahead_{k}" for k in PER_REQUEST}
    assert all(f"`{name}`" in section for name in PER_ENGINE)
