"""`method: lookahead` through vLLM's own config path, with vLLM's own decisions (no engine started)."""

import contextlib

import pytest

from vllm_lookahead.config import LookaheadConfigError
from vllm_lookahead.engine.hooks.startup import PROPOSER_PATH, LookaheadStartupError


def test_async_engine_args_accept_lookahead(toy_model):
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = AsyncEngineArgs(
        model=toy_model,
        speculative_config={"method": "lookahead", "window_size": 3, "ngram_size": 4, "guess_set_size": 2},
    )
    config = args.create_engine_config()
    spec = config.speculative_config
    assert spec.method == "custom_class" and spec.model == PROPOSER_PATH
    # window W*(N-1) - 1, one candidate of N-1 and the lead, which may grow to max_lead_tokens (32)
    assert spec.num_speculative_tokens == (3 * 3 - 1) + 1 * 3 + 32
    assert config.additional_config["lookahead"]["window_size"] == 3
    assert config.scheduler_config.async_scheduling is False


def test_engine_args_reject_bad_lookahead_key(toy_model):
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(LookaheadConfigError, match="unknown field 'guess_set'"):
        EngineArgs(model=toy_model, speculative_config={"method": "lookahead", "guess_set": 2}).create_engine_config()


def test_plain_vllm_methods_untouched(toy_model):
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(
        model=toy_model, speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    ).create_engine_config()
    assert config.speculative_config.method == "ngram"
    assert "lookahead" not in (config.additional_config or {})


@contextlib.contextmanager
def fresh_envs():
    """vLLM caches its environment variables once a service started in this process."""
    import vllm.envs as envs

    cached = envs._is_envs_cache_enabled()
    if cached:
        envs.disable_envs_cache()
    try:
        yield
    finally:
        if cached:
            envs.enable_envs_cache()


def _lookahead_engine_config(toy_model):
    from vllm.engine.arg_utils import EngineArgs

    with fresh_envs():
        return EngineArgs(model=toy_model, speculative_config={"method": "lookahead"}).create_engine_config()


@pytest.mark.parametrize("force", ["env", "watermark", "hisparse"])
def test_model_runner_v2_is_refused_at_start_up(toy_model, monkeypatch, force):
    """vLLM's own ``VllmConfig.use_v2_model_runner`` decides (V1 for custom_class unless forced);
    where it says V2, lookahead's V1-runner patches would not run, so start-up stops.

    On this CPU vLLM itself refuses V2 earlier ("Model Runner V2 requires Triton"), so the
    switch is set on a finished config and vLLM's property is evaluated on it."""
    from vllm_lookahead.engine.hooks import startup

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    config = _lookahead_engine_config(toy_model)
    with fresh_envs():
        assert not config.use_v2_model_runner  # custom_class: vLLM falls back to V1
        startup.check_engine_config(config)
        if force == "env":
            monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
            needle = "VLLM_USE_V2_MODEL_RUNNER=1"
        elif force == "watermark":
            monkeypatch.setattr(config, "watermark_config", object(), raising=False)
            needle = "watermarking"
        else:
            monkeypatch.setattr(config.attention_config, "hisparse_config", object(), raising=False)
            needle = "HiSparse"
        assert config.use_v2_model_runner  # vLLM's decision, not ours
        with pytest.raises(LookaheadStartupError, match=f"Model Runner V2 .*{needle}"):
            startup.check_engine_config(config)


def test_pipeline_parallel_is_refused(toy_model):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=toy_model, speculative_config={"method": "lookahead"}, pipeline_parallel_size=2)
    with pytest.raises(LookaheadStartupError, match="pipeline parallelism"):
        args.create_engine_config()
