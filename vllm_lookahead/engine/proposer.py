"""The lookahead drafter as vLLM sees it: a ``custom_class`` proposer.

vLLM 0.32 loads ``speculative_config.model`` = ``vllm_lookahead.engine.proposer.LookaheadProposer``
through its documented ``method="custom_class"`` hook (``v1/spec_decode/custom_class_proposer.py``)
and calls :meth:`LookaheadProposer.propose` after every step with the sampled tokens.
vLLM believes the returned drafts are linear; they are not: each list is the
node order of a :class:`~vllm_lookahead.core.DraftTree` (root excluded) whose
structure stays here, in :attr:`pending`, until the runner patches
(:mod:`vllm_lookahead.engine.runner`) rebuild it next step from the tokens the
scheduler actually sent (it may truncate them to a prefix).

This object is also the per-worker registry of request states (window + pool),
keyed by vLLM request id: created on the first decode, dropped on finish/abort,
reset on preemption.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import RequestLookahead, StepDraft
from vllm_lookahead.engine.eligibility import draft_blocker
from vllm_lookahead.engine.stats import LookaheadStats

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format

ADDITIONAL_CONFIG_KEY = "lookahead"


@dataclass
class StepOutcome:
    """What the target forward said about one request's draft (set by verification)."""

    draft: StepDraft
    num_nodes: int  # nodes actually run (scheduler may truncate)
    argmax: np.ndarray  # (num_nodes,) target argmax per node, -1 where no logits


class LookaheadProposer:
    """Per-worker lookahead state and vLLM ``custom_class`` proposer interface."""

    def __init__(self, vllm_config: Any) -> None:
        raw = (getattr(vllm_config, "additional_config", None) or {}).get(ADDITIONAL_CONFIG_KEY)
        self.config = LookaheadConfig.model_validate(raw or {}, strict=False)
        self.params = self.config.core_params
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        device = _device_type(vllm_config)
        self.device = device
        # CPU "auto": one candidate chain (the lead), no window -- vLLM's causal kernel verifies it.
        self.chain_only = self.config.chain_only(device)
        self.states: dict[str, RequestLookahead] = {}
        self.pending: dict[str, StepDraft] = {}
        self.outcomes: dict[str, StepOutcome] = {}
        self.stats = LookaheadStats()
        self._warned: set[str] = set()
        self.runner: Any = None

    # -- vLLM drafter protocol ---------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No draft model: lookahead drafts come from the target model itself."""

    def bind(self, runner: Any) -> None:
        self.runner = runner

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Observe this step's outcome per request and return next step's draft tokens."""
        runner = self.runner
        assert runner is not None, "LookaheadProposer used before the runner patch bound it"
        t0 = time.perf_counter()
        drafts: list[list[int]] = []
        budget = self._budget_per_request(sum(1 for s in sampled_token_ids if s))
        for i, req_id in enumerate(runner.input_batch.req_ids):
            new_tokens = sampled_token_ids[i] if i < len(sampled_token_ids) else []
            outcome = self.outcomes.pop(req_id, None)
            if not new_tokens or (budget == 0 and outcome is None):
                # Nothing to draft this step (no new token, or a batch too full for drafts):
                # the pools catch up on the skipped tokens when the request drafts again.
                self.pending.pop(req_id, None)
                drafts.append([])
                continue
            num_tokens = int(num_tokens_no_spec[i])
            history = token_ids_cpu[i, :num_tokens]
            req_state = runner.requests[req_id]
            state = self.states.get(req_id)
            if state is None:
                prompt = req_state.prompt_token_ids or []
                state = RequestLookahead(
                    self.params, prompt, seed=self._seed_for(prompt)
                )
                self.states[req_id] = state
            if outcome is not None:
                state.observe(outcome.draft, outcome.num_nodes, outcome.argmax, new_tokens, history)
            else:
                state.catch_up(history)
            recent = history[max(0, num_tokens - self.params.lookup_context) :]
            drafts.append(self._next_draft(req_id, req_state, state, new_tokens[-1], recent, num_tokens, budget))
        self.stats.propose_seconds += time.perf_counter() - t0
        return drafts

    # -- helpers ---------------------------------------------------------------------
    def _budget_per_request(self, num_decoding: int) -> int | None:
        """Draft nodes each request may add so the forward stays within the step cap."""
        return self.config.draft_budget(self.device, num_decoding)

    def _next_draft(
        self,
        req_id: str,
        req_state: Any,
        state: RequestLookahead,
        root: int,
        recent: Any,
        num_tokens: int,
        budget: int | None,
    ) -> list[int]:
        sp = req_state.sampling_params
        reason = draft_blocker(sp, len(req_state.output_token_ids))
        if reason is not None:
            self._warn_once(reason)
            self.pending.pop(req_id, None)
            return []
        # Room left before max_model_len: the next step runs the root plus the drafts.
        room = self.max_model_len - num_tokens - 1
        if sp is not None and sp.max_tokens is not None:
            # The step after this one yields at least one token; drafting for the
            # very last token only costs compute (vLLM truncates at max_tokens).
            if len(req_state.output_token_ids) >= sp.max_tokens - 1:
                room = 0
        if budget is not None:
            room = min(room, budget)
        if room <= 0:
            self.pending.pop(req_id, None)
            return []
        if self.chain_only:
            draft = state.propose(int(root), recent, budget=room, window=False, max_candidates=1)
        else:
            draft = state.propose(int(root), recent, budget=room)
        self.pending[req_id] = draft
        tokens = draft.tree.draft_tokens
        self.stats.on_propose(draft)
        return tokens[:room]

    def _seed_for(self, prompt_token_ids: Sequence[int]) -> int:
        """Window RNG seed: a function of the config seed and the prompt only.

        Not of vLLM's request id, which carries a random suffix: the same prompt gets the
        same initial window in every run (reproducible MAT) and on every tensor-parallel rank.
        """
        digest = zlib.crc32(np.asarray(prompt_token_ids, dtype=np.int64).tobytes())
        return (self.config.seed * 1_000_003 + digest) & 0x7FFFFFFF

    def _warn_once(self, reason: str) -> None:
        if reason not in self._warned:
            self._warned.add(reason)
            logger.warning("lookahead: requests with %s run without drafts (exact, no speedup)", reason)

    def forget(self, req_ids: Any) -> None:
        for req_id in req_ids:
            self.states.pop(req_id, None)
            self.pending.pop(req_id, None)
            self.outcomes.pop(req_id, None)

    def on_preempted(self, req_ids: Any) -> None:
        """A preempted request recomputes its KV; its draft is void, its pool stays useful."""
        for req_id in req_ids:
            self.pending.pop(req_id, None)
            self.outcomes.pop(req_id, None)
            state = self.states.get(req_id)
            if state is not None and self.runner is not None and req_id in self.runner.requests:
                state.reset(self.runner.requests[req_id].prompt_token_ids or [])


def _device_type(vllm_config: Any) -> str:
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    if device:
        return str(device)
    from vllm.platforms import current_platform

    return str(current_platform.device_type)
