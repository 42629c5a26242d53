"""How each step's trees are sized: one mode, decided once by the config
(:attr:`vllm_lookahead.config.LookaheadConfig.mode`, from ``max_tokens_per_step``)."""

from __future__ import annotations

import enum


class DraftMode(enum.Enum):
    AUTO = "auto"  # the cost-aware draft rule, priced by the forward cost measured on the running hardware
    CAP = "cap"  # a fixed cap on the tokens one forward carries for decoding requests
    FULL = "full"  # every request's full tree every step (``max_tokens_per_step: 0``, no cap)
