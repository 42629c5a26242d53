"""Helpers for tests: a tiny random Llama with a real tokenizer (no downloads).

Importing this package is cheap; torch/transformers/tokenizers load only when a model is built.
"""

from support.toy_model import (
    CHAT_TEMPLATE,
    DEFAULT_PROMPTS,
    LOGIT_STD,
    build_toy_llama,
    cycle_prompt,
    greedy_logit_gaps,
    successor_map,
    toy_corpus,
)

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_PROMPTS",
    "LOGIT_STD",
    "build_toy_llama",
    "cycle_prompt",
    "greedy_logit_gaps",
    "successor_map",
    "toy_corpus",
    "make_config",
]


def make_config(**keys):
    """A :class:`~vllm_lookahead.config.LookaheadConfig` from user keys and
    :class:`~vllm_lookahead.config.Ablation` keys alike (the ablation ones go to its ``ablation``)."""
    from vllm_lookahead.config import Ablation, LookaheadConfig

    ablation = {k: keys.pop(k) for k in list(keys) if k in Ablation.model_fields}
    return LookaheadConfig(**keys, ablation=Ablation(**ablation))
