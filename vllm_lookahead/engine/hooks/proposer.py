"""The lookahead drafter as vLLM sees it: a thin ``custom_class`` adapter.

vLLM 0.32 loads ``speculative_config.model`` = ``vllm_lookahead.engine.hooks.proposer.LookaheadProposer``
through its documented ``method="custom_class"`` hook (``v1/spec_decode/custom_class_proposer.py``),
constructs it with the ``VllmConfig`` and calls :meth:`LookaheadProposer.propose` after
every step.  Everything behind that call -- request states, pending trees, the
step's outcomes -- belongs to :class:`~vllm_lookahead.engine.runner.RunnerLookahead`,
which attaches itself when the runner first needs it; this class only forwards.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np

from vllm_lookahead.config import LookaheadConfig

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format


class DraftOwner(Protocol):
    """What the proposer forwards to: the runner's lookahead state (``RunnerLookahead``)."""

    def propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[list[int]]: ...


class LookaheadProposer:
    """vLLM ``custom_class`` proposer: forwards ``propose`` to the runner's lookahead state."""

    def __init__(self, vllm_config: Any) -> None:
        self.config = LookaheadConfig.from_vllm_config(vllm_config)
        self.owner: DraftOwner | None = None

    def attach(self, owner: DraftOwner) -> None:
        """``owner`` answers :meth:`propose` from now on (the runner's lookahead state, when created)."""
        self.owner = owner

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No draft model: lookahead drafts come from the target model itself.  vLLM's runner logs
        "Loading drafter model..." before calling this for any proposer; the line logged here
        says what actually happens."""
        logger.info(
            'lookahead: no drafter model to load (vLLM\'s "Loading drafter model..." is its call '
            "into this proposer): drafts come from n-gram pools of the prompt and output and from "
            "the Jacobi window, all run by the target model"
        )

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Next step's draft tokens per request (each list is a tree's node order, root excluded)."""
        if self.owner is None:
            raise RuntimeError(
                "vllm-lookahead: the proposer was called before the runner's lookahead state existed "
                "(the V1 model runner patches are not active in this process)"
            )
        return self.owner.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
