"""`method: lookahead` through vLLM's own config path (no engine started)."""

import pytest

from vllm_lookahead.config import LookaheadConfigError
from vllm_lookahead.engine.config_hook import PROPOSER_PATH


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
