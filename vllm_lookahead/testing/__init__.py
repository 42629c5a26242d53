"""Helpers for tests: a tiny random Llama with a real tokenizer (no downloads).

Importing this package is cheap; torch/transformers/tokenizers load only when a model is built.
"""

from vllm_lookahead.testing.toy_model import (
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
]
