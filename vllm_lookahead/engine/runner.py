"""The one owner of lookahead's state in a worker: :class:`RunnerLookahead`.

vLLM runs one model runner per worker process; when its drafter is our
``custom_class`` proposer, the runner gets one ``RunnerLookahead`` (created on
first use, :meth:`RunnerLookahead.of`).  The patch table
(:mod:`vllm_lookahead.engine.hooks.patches`) calls it at each point of a step, in
order -- the data path of one step:

``_update_states``   :meth:`~RunnerLookahead.on_update_states`: free finished
                     requests, void drafts of preempted ones, drop last step's batch
``_prepare_inputs``  :meth:`~RunnerLookahead.on_prepare_inputs`: lay out the trees
                     the scheduler sent (:mod:`vllm_lookahead.engine.step.tree_batch`), rewrite draft RoPE
                     positions to ``context + depth`` (KV slots stay linear),
                     choose logits rows
``AttentionImpl.forward``  reads the batch through ``STEP_CONTEXT.tree_batch()``
                     (:mod:`vllm_lookahead.engine.hooks.step_context`)
                     and recomputes branching trees' draft rows (:mod:`vllm_lookahead.engine.step.attention`)
``_sample``          :meth:`~RunnerLookahead.sample`: verify, compact KV
                     (:mod:`vllm_lookahead.engine.step.verification`), keep each request's outcome
``propose_draft_token_ids`` -> the proposer (a thin adapter) ->
                     :meth:`~RunnerLookahead.propose`: every request's window
                     slides and pools learn, next trees are planned and built
                     (:func:`~vllm_lookahead.core.drafting.draft_step`; through the batch's
                     pools, :func:`~vllm_lookahead.core.batch_step.draft_batch`)

State, by lifetime: per engine -- the config, the paged KV cache (:class:`vllm_lookahead.engine.step.kv.PagedKV`,
checked at start-up by :mod:`vllm_lookahead.engine.step.kv_layers`), the cost model with its clocks
(:class:`vllm_lookahead.engine.propose.step_timing.StepTiming`), stats; per request -- one record in :attr:`live`
(:mod:`vllm_lookahead.engine.propose.live_requests`: window + pools, the tree whose tokens vLLM holds as a linear draft
list, that tree's outcome from ``_sample`` to the next ``propose``); per step -- :attr:`batch`
(from ``_prepare_inputs`` to ``_sample``) and :attr:`report`.  Nothing else in the plugin keeps
per-step state.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from typing import Any

import numpy as np
import torch

from vllm_lookahead.config import DraftMode, LookaheadConfig
from vllm_lookahead.core import RequestLookahead, StepDraft, drafting
from vllm_lookahead.core.batch_step import StepAsk, draft_batch
from vllm_lookahead.core.draft_rule import PooledConfidence, acceptance_rows, compile_plan, lead_floor
from vllm_lookahead.core.drafting import DraftRequest
from vllm_lookahead.core.pool import SharedPools
from vllm_lookahead.core.pool_batch import PoolBatch
from vllm_lookahead.core.request import StepCandidates
from vllm_lookahead.core.request_text import compile_pools
from vllm_lookahead.core.sampling import compile_walks
from vllm_lookahead.core.tree import compile_tree
from vllm_lookahead.engine.hooks.proposer import LookaheadProposer
from vllm_lookahead.engine.hooks.step_context import STEP_CONTEXT
from vllm_lookahead.engine.metrics.stats import LookaheadStats, StepReport
from vllm_lookahead.engine.propose import eligibility, request_overrides
from vllm_lookahead.engine.propose.cost_profile import agree_across_ranks, profile_forward_cost
from vllm_lookahead.engine.propose.eligibility import Undrafted
from vllm_lookahead.engine.propose.live_requests import LiveRequests
from vllm_lookahead.engine.propose.room import draft_room, window_seed
from vllm_lookahead.engine.propose.state_builds import StateBuilds
from vllm_lookahead.engine.propose.step_timing import StepTiming
from vllm_lookahead.engine.propose.thinking_budget import ThinkingLimit
from vllm_lookahead.engine.step.kv import PagedKV
from vllm_lookahead.engine.step.kv_layers import paged_kv_of
from vllm_lookahead.engine.step.layout_loop import compile_layout
from vllm_lookahead.engine.step.sampler_noise import compile_draw
from vllm_lookahead.engine.step.tree_batch import TreeBatch, build_tree_batch
from vllm_lookahead.engine.step.verification import StepOutcome, sample_one_row_per_request, verify_step

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format


def _new_state(
    config: LookaheadConfig, prompt: list[int], shared: SharedPools | None, pooled: PooledConfidence
) -> RequestLookahead:
    """A new request's window and pools (the prompt read once into an array: the pools learn it,
    the window's seed and first guesses come from it)."""
    tokens = np.asarray(prompt, dtype=np.int64)
    return RequestLookahead(
        config, tokens, seed=window_seed(config.ablation.seed, tokens), shared=shared, pooled=pooled
    )


class RunnerLookahead:
    """Lookahead's per-worker state and its step hooks (see the module docstring)."""

    def __init__(self, runner: Any, proposer: LookaheadProposer) -> None:
        if runner.model_config.uses_mrope:
            raise NotImplementedError("lookahead: M-RoPE models are not supported")
        self.runner = runner
        self.config: LookaheadConfig = proposer.config
        self.max_model_len = int(runner.model_config.max_model_len)
        # "auto": the forward-cost model the draft rule prices trees with (profiled in setup_kv,
        # refined by every decode step), the verification price and the idle requests' rests
        self.timing = StepTiming(self.config)
        self.live = LiveRequests()  # per request: window + pools, its pending tree, that tree's outcome
        self.builds = StateBuilds()  # new requests' states built, finished ones' released, on a worker
        # where the worker gets them (StateBuilds.hand_over): at the step's start on a CPU, on an
        # accelerator once the step's forward is launched (at sample; setup_kv knows the device)
        self.hand_over_at_sample = False
        self._drafting = False  # whether the last proposal could draft (new requests' states start early)
        self._max_rest = 0  # the longest rest at the last proposal's batch size (new requests' first rest)
        cfg = self.config
        # every request's output n-grams, for the others (opt-in)
        self.shared = SharedPools.for_config(cfg) if cfg.shared_pool else None
        # the live requests' pools, learnt into and asked in one compiled call per phase of a step
        self.pools = PoolBatch(cfg)
        # every request's acceptance records, rows of one table (core/acceptance_rows.py), with how
        # greedy / sampled requests' drafted leads fared against their estimates (a shift for each kind)
        self.acceptance = acceptance_rows(kinds=2)
        self.pooled = {True: PooledConfidence(self.acceptance, 0), False: PooledConfidence(self.acceptance, 1)}
        self.batch: TreeBatch | None = None
        self.kv: PagedKV | None = None
        self.stats = LookaheadStats()
        self.report = StepReport()  # this step's facts for the scheduler (taken with vLLM's output)
        self._warned: set[Undrafted] = set()
        self._reported: dict[str, str] = {}  # each live request's last reason reported for having no draft
        # Engine-wide reason not to draft: custom logits processors cannot be replayed per tree node.
        custom = getattr(runner.model_config, "logits_processors", None)
        self.blocked = Undrafted.LOGITS_PROCESSORS if custom else None
        self._thinking: ThinkingLimit | None = None
        proposer.attach(self)
        logger.info("lookahead decoding active: %s", self.config.summary())

    @classmethod
    def of(cls, runner: Any) -> RunnerLookahead | None:
        """The runner's lookahead state, created on first use; None when lookahead is off."""
        state = runner.__dict__.get("_lookahead", False)
        if state is False:
            drafter = getattr(runner, "drafter", None)
            state = cls(runner, drafter) if isinstance(drafter, LookaheadProposer) else None
            runner._lookahead = state
            if state is not None:
                STEP_CONTEXT.register(state)  # for the hooks vLLM calls without a runner
        return state

    # -- engine start-up -----------------------------------------------------------------
    def setup_kv(self) -> str:
        """After the KV cache exists: check every layer is one the tree path reproduces, pin the
        cache as it reads it (:func:`vllm_lookahead.engine.step.kv_layers.paged_kv_of`), compile
        the pools' loops, the step layout's, the sampled walks', the trees' (building, ancestor words), the draft
        rule's, on a CPU the sampled draw's (elsewhere hand the worker its share at sample,
        :attr:`hand_over_at_sample`), profile the forward cost.  Returns the attention backend's name."""
        self.kv = paged_kv_of(self.runner)
        compile_pools(self.config)
        compile_layout()
        compile_walks()
        compile_tree()  # the trees' building (and the Triton kernel's plan: their ancestor words)
        if torch.device(self.runner.device).type == "cpu":
            compile_draw()  # sampled walks draw on CPU tensors there
        else:
            self.hand_over_at_sample = True  # the engine thread waits for the device after the launch
        if self.config.mode is DraftMode.AUTO:
            compile_plan()
            self.timing.cost, self.timing.frozen = agree_across_ranks(profile_forward_cost(self.runner))
        return self.kv.backend

    # -- step hooks, in the order vLLM calls them -----------------------------------------
    def on_update_states(self, scheduler_output: Any) -> None:
        self.batch = None
        self.forget(scheduler_output.finished_req_ids)
        preempted = getattr(scheduler_output, "preempted_req_ids", None) or set()
        resumed = scheduler_output.scheduled_cached_reqs.resumed_req_ids
        self.on_preempted(set(preempted) | set(resumed))
        for new in scheduler_output.scheduled_new_reqs:
            # where hardly any offer drafts, a new request starts resting (LiveRequests.arrive)
            self.live.arrive(new.req_id, self._max_rest, len(new.prompt_token_ids or ()))
            if self._drafting and new.sampling_params is not None:
                # while the engine drafts, a new request's state is built beside its prefill
                self.builds.start(new.req_id, self._state_build(new.prompt_token_ids, new.sampling_params))
        if not self.hand_over_at_sample:
            self.builds.hand_over()

    def on_prepare_inputs(self, scheduler_output: Any, result: tuple) -> tuple:
        """Lay out trees, fix positions, choose logits rows; returns ``_prepare_inputs``' result."""
        self.batch = None
        self.live.new_step()
        spec = scheduler_output.scheduled_spec_decode_tokens
        self.timing.step_started(scheduler_output)
        if not spec:
            return result
        runner = self.runner
        ib = runner.input_batch
        num_reqs = ib.num_reqs
        qsl = runner.query_start_loc.np[: num_reqs + 1]
        batch = build_tree_batch(
            req_ids=list(ib.req_ids),
            scheduled_spec=spec,
            draft_of=self.live.draft,
            query_start_loc=qsl,
            num_scheduled=qsl[1:] - qsl[:-1],
            num_computed=ib.num_computed_tokens_cpu[:num_reqs],
            device=runner.device,
            # vLLM's grammar bitmask walks logits rows request by request
            roots_first=not scheduler_output.has_structured_output_requests,
        )
        if batch is None:
            return result
        batch.write_positions(runner.positions)
        batch.kv_rows = (ib.block_table[0], int(qsl[-1]), num_reqs)  # read where the step needs them
        batch.kv = self.kv
        self.batch = batch
        if self.timing.timing_step:
            self.timing.tree_rows(sum(tr.num_nodes - tr.first_branch_node for tr in batch.branching))
        _, spec_meta, max_sampled = result
        return batch.logits_indices, spec_meta, max_sampled

    def sample(self, logits: torch.Tensor, spec_decode_metadata: Any) -> Any | None:
        """This step's ``SamplerOutput``, or None to let vLLM's own ``_sample`` run; the step's time,
        sampling and verification included, goes to the cost model (:meth:`.StepTiming.step_sampled`).
        On an accelerator the step's forward is in flight here: the worker gets its share of request
        turnover (:meth:`.StateBuilds.hand_over`) while this thread waits for the device."""
        if self.hand_over_at_sample:
            self.builds.hand_over()
        try:
            return self._sample(logits, spec_decode_metadata)
        finally:
            self.timing.step_sampled(logits)

    def _sample(self, logits: torch.Tensor, spec_decode_metadata: Any) -> Any | None:
        runner = self.runner
        batch, self.batch = self.batch, None
        if batch is None:
            if spec_decode_metadata is None or not any(spec_decode_metadata.num_draft_tokens):
                # No drafts anywhere in the batch: sample exactly as vLLM without
                # speculation does (its rejection sampler skips logits processors
                # such as min_p/logit_bias, which lookahead lets through; its
                # thinking-budget holder would use the speculative row layout).
                runner.input_batch.update_async_output_token_ids()
                return sample_one_row_per_request(runner.sampler, logits, runner.input_batch.sampling_metadata)
            return None
        if batch.needs_tree_attention and batch.tree_attention_layers == 0:
            raise RuntimeError(
                "vllm-lookahead: this step carried branching trees but no attention layer applied the "
                "tree mask (a CUDA graph replayed attention, or the attention backend was not patched); "
                "the drafts' logits would be wrong"
            )
        t0 = time.perf_counter()
        runner.input_batch.update_async_output_token_ids()
        output, outcomes = verify_step(runner, logits, batch)
        self.on_verified(outcomes)
        self.report.verify_seconds += time.perf_counter() - t0
        if self.stats.maybe_log():
            self.timing.log()
        return output

    def on_verified(self, outcomes: dict[str, StepOutcome]) -> None:
        """This step's trees verified: each outcome kept for its request's next proposal, counted
        in the stats and the step's report, its host time priced."""
        self.timing.verified(outcomes.values())
        for req_id, outcome in outcomes.items():
            self.stats.on_verified(outcome.num_nodes - 1, outcome.num_accepted, outcome.draft, outcome.path_sources)
            self.report.on_verified(req_id, outcome)
            if outcome.draft is not None:
                self.live.set_outcome(req_id, outcome)
            else:
                self.stats.foreign_drafts += 1

    def propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[list[int]]:
        """Observe this step's outcome per request and return next step's draft tokens (vLLM order):
        every request observes (window, pools, acceptance) -- but an idle one resting -- those
        with room get candidates; one :func:`~vllm_lookahead.core.drafting.draft_step` builds the
        step's trees (:meth:`_drafts`)."""
        t0 = time.perf_counter()
        self.builds.hand_over()  # anything a step without a sample left queued
        decoding = sum(1 for s in sampled_token_ids if s)
        rule = self.config.mode is DraftMode.AUTO  # the draft rule sizes this step
        budget = self.config.draft_budget(decoding)
        can_draft = self._drafting = self._can_draft(decoding, budget)
        floor = lead_floor(self.timing.model(), decoding, self.config.lead_tokens) if rule and can_draft else 0.0
        for pooled in self.pooled.values():
            pooled.age()
        max_rest = self._max_rest = self.timing.request_rest(decoding) if rule and can_draft else 0
        req_ids = self.runner.input_batch.req_ids
        drafts: list[list[int]] = [[] for _ in req_ids]
        # Every request observes its step first, then those that draft ask for candidates: what
        # one request learns (the shared pools, the engine's pooled lead record) is there for all.
        observed = []
        proposing = self._proposing(req_ids, sampled_token_ids, num_tokens_no_spec, can_draft)
        # the batch learns after all observed, and asks for all (a few requests ask on their own:
        # the batch's calls cost more than theirs)
        batch = len(proposing) >= PoolBatch.FROM
        learning: list[tuple[str, RequestLookahead, int, int, int]] | None = [] if batch else None
        for i in proposing:
            req_id = req_ids[i]
            new_tokens = sampled_token_ids[i] if i < len(sampled_token_ids) else []
            history = token_ids_cpu[i, : int(num_tokens_no_spec[i])] if new_tokens else None
            state = self._observe(req_id, i, new_tokens, history, can_draft, learning)
            if state is None or not can_draft:
                if new_tokens and can_draft:  # the pools catch up on skipped tokens when the request drafts again
                    self._undrafted(req_id, Undrafted.BATCH_FULL)
                continue
            observed.append((i, req_id, state, new_tokens, history))
        self.acceptance.fresh()  # the step's observations of every request's records, in one call
        if learning:
            self._learn(learning, token_ids_cpu)
        asks: list[StepAsk] = []
        thinking: list[ThinkingLimit | None] = []  # each ask's thinking-budget limit
        prices = {greedy: self._prices(greedy) for greedy in (True, False)} if observed else {}
        for i, req_id, state, new_tokens, history in observed:
            ask = self._ask(i, req_id, state, new_tokens, history, budget, prices)
            if isinstance(ask, Undrafted):
                self._undrafted(req_id, ask)
            else:
                asks.append(ask[0])
                thinking.append(ask[1])
        for ask, limit, draft in zip(asks, thinking, self._drafts(asks, token_ids_cpu, floor, batch, rule, decoding)):
            req_id = req_ids[ask.row]
            drafts[ask.row] = self._emit(req_id, draft, ask.room, limit)
            if rule:
                self.live.offered(req_id, bool(drafts[ask.row]), max_rest, ask.length)
        seconds = time.perf_counter() - t0
        if rule and can_draft:
            self.timing.proposed_for(seconds, len(asks))
        self.report.propose_seconds += seconds
        return drafts

    def _proposing(
        self, req_ids: list[str], sampled: list[list[int]], lengths: np.ndarray, can_draft: bool
    ) -> list[int]:
        """The indices of the requests that observe their step (and, if ``can_draft``, ask for
        candidates): all but those resting (no lookups, their pools catch up when they propose
        again); where none may draft, only those with an outcome to observe (the others' pools
        catch up later), every request's reason being a batch too full."""
        if can_draft:
            return self.live.proposing(req_ids, sampled, lengths)
        self._undrafted_all(req_ids, sampled, Undrafted.BATCH_FULL)
        return self.live.observing(req_ids)

    def _undrafted(self, req_id: str, reason: Undrafted) -> None:
        """Why the request's next step has no draft, for the step's report (the scheduler's table,
        :mod:`vllm_lookahead.engine.metrics.spec_metrics`, keeps each request's last reason): only
        where it differs from the last one reported, so a batch too full for drafts reports each
        request once, not every step."""
        label = reason.label
        if self._reported.get(req_id) is not label:
            self._reported[req_id] = self.report.undrafted[req_id] = label

    def _undrafted_all(self, req_ids: list[str], sampled: list[list[int]], reason: Undrafted) -> None:
        """:meth:`_undrafted` for every request with new tokens (a step in which none may draft)."""
        label, reported = reason.label, self._reported
        changed = [r for r, tokens in zip(req_ids, sampled) if tokens and reported.get(r) is not label]
        if changed:
            reported.update(dict.fromkeys(changed, label))
            self.report.undrafted.update(dict.fromkeys(changed, label))

    def _can_draft(self, decoding: int, budget: int | None) -> bool:
        """Whether any request may draft next step: under a fixed cap, if the cap leaves room;
        under the draft rule, if even a certain draft token would pay at this batch size; full
        trees always."""
        mode = self.config.mode
        if decoding <= 0:
            return False
        if mode is DraftMode.CAP:
            return bool(budget)
        return mode is DraftMode.FULL or self.timing.any_draft_pays(decoding)

    def _observe(
        self,
        req_id: str,
        i: int,
        new_tokens: list[int],
        history: np.ndarray | None,
        can_draft: bool,
        learning: list[tuple[str, RequestLookahead, int, int, int]] | None,
    ) -> RequestLookahead | None:
        """The request's state after this step's outcome (its window and pools updated; created
        on first use with the request's own settings); None when there is nothing to observe now
        (no new token, or a batch too full for drafts and no tree run).  A request whose pools
        are in :attr:`pools` leaves its new tokens' n-grams to ``learning`` (its row ``i`` of
        the token array and the span of it to learn; None: it learns them itself), which the
        batch learns once every request observed."""
        outcome = self.live.take_outcome(req_id)
        if not new_tokens or history is None or (not can_draft and outcome is None):
            return None
        state = self.live.state(req_id)
        if state is None:
            state = self.builds.take(req_id)
            if state is None:
                req_state = self.runner.requests[req_id]
                state = self._state_build(req_state.prompt_token_ids, req_state.sampling_params)()
            self.live.add_state(req_id, state)
            self.pools.add(state.text)
        batched = learning is not None and state.text.batch_at is not None
        length = len(history)
        if outcome is not None:
            assert outcome.draft is not None
            state.observe(
                outcome.draft, outcome.num_nodes, outcome.argmax, new_tokens, history, outcome.path, learn=not batched
            )
            start = length - len(new_tokens)
        else:
            start = state.text.known
            state.catch_up(history, learn=not batched)
        if not batched:
            self.live.learnt((req_id,))
        elif length > start:
            learning.append((req_id, state, i, start, length))  # type: ignore[union-attr]
        return state

    def _learn(self, learning: list[tuple[str, RequestLookahead, int, int, int]], tokens: np.ndarray) -> None:
        """The batch learns what :meth:`_observe` left to it (the requests' pools counted at the next count)."""
        self.pools.learn([x[1].text for x in learning], tokens, *zip(*(x[2:] for x in learning)))
        self.live.learnt(x[0] for x in learning)

    def _state_build(self, prompt: list[int] | None, sp: Any) -> functools.partial[RequestLookahead]:
        """What builds a new request's state: its own settings (extra_args, validated where vLLM
        accepted it) and the pooled lead record of its kind are read here, the build itself reads
        nothing that changes (it may run on :attr:`builds`' thread)."""
        cfg, shared = request_overrides.for_request(self.config, sp, self.shared)
        pooled = self.pooled[sp is None or eligibility.is_greedy(sp)]
        return functools.partial(_new_state, cfg, prompt or [], shared, pooled)

    def _ask(
        self,
        i: int,
        req_id: str,
        state: RequestLookahead,
        new_tokens: list[int],
        history: np.ndarray,
        budget: int | None,
        prices: dict[bool, tuple[float, float]],
    ) -> tuple[StepAsk, ThinkingLimit | None] | Undrafted:
        """What the request asks of its pools this step (its room, its root and recent text; its
        kind's host prices, :meth:`_prices`) and its thinking-budget limit, or the reason it
        drafts nothing.  Random sampling tries a node's children in turn, so candidates sharing a
        prefix are merged into one trie (a duplicate child could never be accepted); greedy keeps
        the config's."""
        req_state = self.runner.requests[req_id]
        room, thinking, reason = self._room(i, req_state, new_tokens, history, budget)
        if room <= 0:
            return reason
        sp = req_state.sampling_params
        limit = 1 if eligibility.chain_only(sp) else None
        root = int(new_tokens[-1])
        greedy = eligibility.is_greedy(sp)
        merge = None if greedy else True
        return StepAsk(state, i, len(history), root, room, limit, limit is None, merge, *prices[greedy]), thinking

    def _drafts(
        self, asks: list[StepAsk], tokens: np.ndarray, floor: float, batch: bool, rule: bool, decoding: int
    ) -> list[StepDraft]:
        """Each ask's draft: under the draft rule, where the step goes through the batch and every
        ask's pools are in :attr:`pools`, from the batch's arrays (:func:`.draft_batch`); else from
        each ask's candidates (:meth:`_candidates`, :func:`~vllm_lookahead.core.drafting.draft_step`)."""
        if not asks:
            return []
        cost = self.timing.model() if rule else None
        if cost is not None and batch and all(ask.state.text.batch_at is not None for ask in asks):
            return draft_batch(self.pools, asks, tokens, floor, cost, base_tokens=decoding)
        requests = [
            DraftRequest(a.state, c, a.room, a.window, a.merge, a.verify_seconds, a.token_seconds)
            for a, c in zip(asks, self._candidates(asks, tokens, floor, batch))
        ]
        return drafting.draft_step(requests, cost, base_tokens=decoding)

    def _candidates(self, asks: list[StepAsk], tokens: np.ndarray, floor: float, batch: bool) -> list[StepCandidates]:
        """Each ask's candidates: those of requests in :attr:`pools` from one batch of lookups
        (:meth:`.PoolBatch.step_candidates`) if ``batch``, the others' from their own."""
        out: list[StepCandidates | None] = [None] * len(asks)
        batched = [k for k, ask in enumerate(asks) if batch and ask.state.text.batch_at is not None]
        if batched:
            found = self.pools.step_candidates(
                [(*asks[k][:6], floor) for k in batched],  # state, row, length, root, room, max_candidates
                tokens,
            )
            for k, cands in zip(batched, found):
                out[k] = cands
        context = self.config.lookup_context
        for k, ask in enumerate(asks):
            if out[k] is None:
                recent = tokens[ask.row, max(0, ask.length - context) : ask.length]
                out[k] = ask.state.step_candidates(ask.root, recent, ask.room, ask.max_candidates, min_gain=floor)
        return out  # type: ignore[return-value]

    def _prices(self, greedy: bool) -> tuple[float, float]:
        """What verifying a tree and each accepted token cost the host for a request of this kind
        (:meth:`.StepTiming.verify_seconds`, :meth:`.StepTiming.token_seconds`): read once per step."""
        return self.timing.verify_seconds(greedy), self.timing.token_seconds(greedy)

    def _emit(self, req_id: str, draft: StepDraft, room: int, thinking: ThinkingLimit | None) -> list[int]:
        """The draft's tokens as vLLM carries them (cut to the room and before any thinking-end
        marker), the tree kept for verification; nothing (reason ``no_candidate``) if none."""
        tokens = draft.tree.draft_tokens[:room]
        if thinking is not None:
            # No marker token in a draft (a prefix of a tree in topological order is a tree).
            tokens = tokens[: thinking.cut(tokens)]
        if not tokens:
            self._undrafted(req_id, Undrafted.NO_CANDIDATE)
            return []
        self.live.set_draft(req_id, draft)
        self.stats.on_propose(draft, len(tokens))
        return tokens

    def _room(
        self, i: int, req_state: Any, new_tokens: list[int], history: np.ndarray, budget: int | None
    ) -> tuple[int, ThinkingLimit | None, Undrafted]:
        """Draft nodes the request may carry next step, its thinking-budget limit if any, and
        the reason when there is no room."""
        sp = req_state.sampling_params
        num_output = len(req_state.output_token_ids)
        reason = self.blocked or eligibility.draft_blocker(sp)
        room = 0 if reason is not None else draft_room(sp, num_output, len(history), self.max_model_len, budget)
        if reason is not None:
            self._warn_once(reason)
        thinking = self.thinking_limit() if sp is not None and sp.thinking_token_budget is not None else None
        if thinking is not None and room > 0:
            limit = thinking.room(i, num_output, len(history) - num_output, new_tokens)
            room = room if limit is None else min(room, limit)
        return room, thinking, reason if reason is not None else Undrafted.NO_ROOM

    def attach_report(self, output: Any) -> Any:
        """vLLM's ``ModelRunnerOutput`` of this step carrying :meth:`take_report` in its field
        ``lookahead_report`` (declared by the patch table, :data:`~vllm_lookahead.engine.hooks.patches.FIELDS`;
        pickled with the
        output when the scheduler is another process); vLLM's shared empty output is copied first.
        Anything else (no output yet, an async or pipeline output) is returned as is."""
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        if not isinstance(output, ModelRunnerOutput):
            return output
        if output is EMPTY_MODEL_RUNNER_OUTPUT:
            output = copy.copy(output)
        output.lookahead_report = self.take_report()
        return output

    def take_report(self) -> dict:
        """This step's :class:`StepReport` as plain data for the scheduler, and a fresh one."""
        report, self.report = self.report, StepReport()
        self.stats.add_time(report.propose_seconds, report.verify_seconds)  # counted once, in the report
        report.pool_ngrams = self.live.pool_ngrams
        if self.shared is not None:
            report.pool_ngrams += self.shared.num_ngrams
        report.request_states = self.num_request_states
        return report.payload()

    @property
    def num_request_states(self) -> int:
        """Requests this worker keeps anything for (a pool and window, built or being built, a
        pending draft or an outcome): the live ones only, once :meth:`forget` has run for finished
        and aborted ones."""
        return len(self.live) + len(self.builds)

    def thinking_limit(self) -> ThinkingLimit | None:
        """How deep thinking-budget requests may be drafted (None: vLLM has no reasoning config,
        so it ignores budgets).  Follows the input batch, which vLLM may rebuild at start-up."""
        holder = getattr(self.runner.input_batch, "thinking_budget_state_holder", None)
        if self._thinking is None or self._thinking.holder is not holder:
            self._thinking = ThinkingLimit.of(self.runner)
        return self._thinking

    # -- request lifecycle ---------------------------------------------------------------
    def forget(self, req_ids: Any) -> None:
        """Finished or aborted requests: drop everything kept for them (their states freed on the
        worker, :meth:`.StateBuilds.release`)."""
        for req_id in req_ids:
            state = self.live.state(req_id)
            if state is not None:
                self.pools.remove(state.text)
                self.builds.release(state)
        self.live.forget(req_ids)
        self.builds.forget(req_ids)
        for req_id in req_ids:
            self._reported.pop(req_id, None)

    def on_preempted(self, req_ids: Any) -> None:
        """A preempted request recomputes its KV; its draft is void, its pool stays useful."""
        for req_id in req_ids:
            state = self.live.preempted(req_id)
            if state is not None and req_id in self.runner.requests:
                state.reset(self.runner.requests[req_id].prompt_token_ids or [])

    def _warn_once(self, reason: Undrafted) -> None:
        if reason not in self._warned:
            self._warned.add(reason)
            level = logging.INFO if reason.client_choice else logging.WARNING
            logger.log(level, "lookahead: requests with %s run without drafts (exact, no speedup)", reason.description)
