"""Accept ``{"method": "lookahead", ...}`` wherever vLLM takes a speculative config.

vLLM 0.32's ``SpeculativeConfig.method`` is a closed ``Literal`` and the config
forbids unknown keys, so the user's dict cannot reach it as is.  We replace
``EngineArgs.create_speculative_config`` (used by ``vllm serve``, ``LLM(...)`` and
``AsyncEngineArgs`` alike) so that a lookahead dict is

1. validated by :class:`vllm_lookahead.config.LookaheadConfig` (clear error naming
   field, value and range -- before vLLM sees anything);
2. stored in ``additional_config["lookahead"]`` (vLLM's documented plugin slot,
   shipped to every engine/worker process with the ``VllmConfig``);
3. handed to vLLM as its documented ``method="custom_class"`` proposer hook with
   ``model="vllm_lookahead.engine.proposer.LookaheadProposer"`` and
   ``num_speculative_tokens`` = the largest tree (it sizes the scheduler's budget
   and the per-position acceptance stats).  ``custom_class`` also makes vLLM turn
   async scheduling off, as lookahead's CPU-side drafting requires.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_lookahead.config import METHOD_NAME, LookaheadConfig
from vllm_lookahead.engine.proposer import ADDITIONAL_CONFIG_KEY

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format

PROPOSER_PATH = "vllm_lookahead.engine.proposer.LookaheadProposer"


def is_lookahead_request(spec: Any) -> bool:
    return isinstance(spec, dict) and str(spec.get("method", "")).lower() == METHOD_NAME


def is_lookahead_config(speculative_config: Any) -> bool:
    """Whether a vLLM ``SpeculativeConfig`` is the one :func:`translate` produced."""
    return speculative_config is not None and getattr(speculative_config, "model", None) == PROPOSER_PATH


def translate(spec: dict[str, Any], additional_config: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], LookaheadConfig]:
    """(vLLM speculative dict, new additional_config, validated lookahead config)."""
    cfg = LookaheadConfig.from_user_dict(spec)
    extra = dict(additional_config or {})
    extra[ADDITIONAL_CONFIG_KEY] = cfg.model_dump()
    vllm_spec = {
        "method": "custom_class",
        "model": PROPOSER_PATH,
        "num_speculative_tokens": cfg.max_draft_tokens,
    }
    return vllm_spec, extra, cfg


def _create_speculative_config(original):
    def patched(self, target_model_config, target_parallel_config):
        if getattr(self, "spec_method", None) == METHOD_NAME:
            self.speculative_config = {**(self.speculative_config or {}), "method": METHOD_NAME}
            self.spec_method = None
        if is_lookahead_request(self.speculative_config):
            self.speculative_config, self.additional_config, cfg = translate(
                self.speculative_config, self.additional_config
            )
            logger.info("vllm-lookahead: speculative method 'lookahead' %s", cfg.summary())
        return original(self, target_model_config, target_parallel_config)

    return patched


def _validate_spec_decode(original):
    """vLLM refuses min_p/logit_bias with any speculative method because its rejection
    sampler ignores them on draft rows.  Lookahead never drafts for such requests (see
    :mod:`.eligibility`) and samples them with vLLM's plain sampler, so they are allowed."""

    def patched(self, speculative_config):
        if is_lookahead_config(speculative_config):
            return None
        return original(self, speculative_config)

    return patched


def install() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams

    from vllm_lookahead.engine.patches import replace_method

    replace_method(EngineArgs, "create_speculative_config", _create_speculative_config)
    replace_method(SamplingParams, "_validate_spec_decode", _validate_spec_decode)
