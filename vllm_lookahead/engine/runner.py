"""The one owner of lookahead's state in a worker: :class:`RunnerLookahead`.

vLLM runs one model runner per worker process; when its drafter is our
``custom_class`` proposer, the runner gets one ``RunnerLookahead`` (created on
first use, :meth:`RunnerLookahead.of`).  The patch table
(:mod:`vllm_lookahead.engine.patches`) calls it at each point of a step, in
order -- the data path of one step:

``_update_states``   :meth:`~RunnerLookahead.on_update_states`: free finished
                     requests, void drafts of preempted ones, drop last step's batch
``_prepare_inputs``  :meth:`~RunnerLookahead.on_prepare_inputs`: lay out the trees
                     the scheduler sent (:mod:`.tree_batch`), rewrite draft RoPE
                     positions to ``context + depth`` (KV slots stay linear),
                     choose logits rows
``AttentionImpl.forward``  reads the batch through :meth:`.step_context.StepContext.tree_batch`
                     and recomputes branching trees' draft rows (:mod:`.attention`)
``_sample``          :meth:`~RunnerLookahead.sample`: verify, compact KV
                     (:mod:`.verify_step`), keep each request's outcome
``propose_draft_token_ids`` -> the proposer (a thin adapter) ->
                     :meth:`~RunnerLookahead.propose`: every request's window
                     slides and pools learn, next trees are built (:mod:`.draft_step`)

State, by lifetime: per engine -- the config, the paged KV cache (:class:`.kv.PagedKV`),
stats; per request -- :attr:`requests` (window + pools) and :attr:`pending` (the
tree whose tokens vLLM holds as a linear draft list); per step -- :attr:`batch`
(from ``_prepare_inputs`` to ``_sample``) and :attr:`outcomes` (from ``_sample``
to the next ``propose``).  Nothing else in the plugin keeps per-step state.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from typing import Any

import numpy as np
import torch

from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import RequestLookahead, StepDraft
from vllm_lookahead.core.draft_gate import DraftGate
from vllm_lookahead.core.draft_rule import lead_floor, plan_step
from vllm_lookahead.core.pool import SharedPools
from vllm_lookahead.core.request import StepCandidates
from vllm_lookahead.core.step_cost import StepCost
from vllm_lookahead.engine.attention import unsupported_feature
from vllm_lookahead.engine.cost_profile import agree_across_ranks, fallback_cost, profile_forward_cost
from vllm_lookahead.engine.draft_step import draft_room, window_seed
from vllm_lookahead.engine import eligibility, request_overrides
from vllm_lookahead.engine.kv import SUPPORTED_BACKENDS, SUPPORTED_CPU_ISAS, PagedKV, kv_views
from vllm_lookahead.engine.proposer import LookaheadProposer
from vllm_lookahead.engine.stats import LookaheadStats, StepReport
from vllm_lookahead.engine.step_context import STEP_CONTEXT
from vllm_lookahead.engine.thinking_budget import ThinkingLimit
from vllm_lookahead.engine.tree_batch import TreeBatch, build_tree_batch
from vllm_lookahead.engine.verify_step import StepOutcome, sample_one_row_per_request, verify_step

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format


class RunnerLookahead:
    """Lookahead's per-worker state and its step hooks (see the module docstring)."""

    def __init__(self, runner: Any, proposer: LookaheadProposer) -> None:
        if runner.model_config.uses_mrope:
            raise NotImplementedError("lookahead: M-RoPE models are not supported")
        self.runner = runner
        self.config: LookaheadConfig = proposer.config
        self.max_model_len = int(runner.model_config.max_model_len)
        # "auto": the cost-aware draft rule sizes every step (core/draft_rule.py) with this
        # forward-cost model, profiled in setup_kv and refined by every decode step.
        self.cost: StepCost | None = None
        self.cost_frozen = False  # tensor parallel: one model for all ranks, not refined per rank
        self._step_clock: tuple[float, int, int] | None = None  # (start, tokens, tree rows) of this step
        # whether drafting pays at all at a batch size, measured (core/draft_gate.py); the last
        # proposal's time and policy, and whether the step since then was decode-only
        # ("measure_drafting": false or VLLM_LOOKAHEAD_DRAFT_GATE=0 leave it out: drafting exactly as
        # the rule plans)
        gate_on = self.config.measure_drafting and os.environ.get("VLLM_LOOKAHEAD_DRAFT_GATE", "1") != "0"
        self.gate = DraftGate() if self.config.cost_rule and gate_on else None
        self._gate_clock: tuple[float, bool] | None = None
        self._decode_step = False
        self.requests: dict[str, RequestLookahead] = {}
        cfg = self.config
        # every request's output n-grams, for the others (opt-in)
        self.shared = SharedPools.for_params(cfg) if cfg.shared_pool else None
        self.pending: dict[str, StepDraft] = {}
        self.outcomes: dict[str, StepOutcome] = {}
        self.batch: TreeBatch | None = None
        self.kv: PagedKV | None = None
        self.stats = LookaheadStats()
        self.report = StepReport()  # this step's facts for the scheduler (taken with vLLM's output)
        self._warned: set[str] = set()
        # Engine-wide reason not to draft: custom logits processors cannot be replayed per tree node.
        custom = getattr(runner.model_config, "logits_processors", None)
        self.blocked = "custom logits processors (--logits-processors)" if custom else None
        self._thinking: ThinkingLimit | None = None
        proposer.attach(self)
        logger.info("lookahead decoding active: %s", self.config.summary())

    @classmethod
    def of(cls, runner: Any) -> "RunnerLookahead | None":
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
        """After the KV cache exists: check every layer is one the tree path reproduces and
        pin the cache as it reads it.  Returns the attention backend's name."""
        runner = self.runner
        groups = runner.kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise NotImplementedError(
                f"lookahead: models with {len(groups)} KV cache groups (hybrid/sliding-window "
                "mixes) are not supported; only a single full-attention group is"
            )
        backend = runner.attn_groups[0][0].backend.get_name()
        if backend not in SUPPORTED_BACKENDS:
            raise NotImplementedError(
                f"lookahead: attention backend {backend} is not supported ({', '.join(SUPPORTED_BACKENDS)} are)"
            )
        mode = getattr(runner.compilation_config, "cudagraph_mode", None)
        if mode is not None and mode.has_full_cudagraphs():
            raise NotImplementedError(
                f"lookahead: cudagraph_mode {mode.name} captures attention in FULL CUDA graphs, which cannot "
                "run the eager tree-attention pass; use -cc.cudagraph_mode=PIECEWISE (what the plugin sets "
                "when it builds the engine config) or NONE"
            )
        ctx = runner.compilation_config.static_forward_context
        caches = []
        for name in groups[0].layer_names:
            layer = ctx[name]
            reason = unsupported_feature(layer.impl)
            if reason is not None:
                raise NotImplementedError(f"lookahead: layer {name} uses {reason}, which tree attention does not implement")
            isa = getattr(layer, "isa", None)
            if backend == "CPU_ATTN" and isa not in SUPPORTED_CPU_ISAS:
                raise NotImplementedError(
                    f"lookahead: CPU attention ISA {isa!r} packs its KV cache in a layout the tree "
                    f"path does not read yet (supported: {', '.join(SUPPORTED_CPU_ISAS)})"
                )
            kv = layer.kv_cache
            caches.append(kv[0] if isinstance(kv, (list, tuple)) else kv)
        block_size = kv_views(caches[0], backend)[0].shape[2]
        table_block_size = runner.input_batch.block_table[0].block_size
        if block_size != table_block_size:
            raise NotImplementedError(
                f"lookahead: the KV cache blocks hold {block_size} tokens but the block table counts "
                f"{table_block_size} (kernel block splitting); not supported"
            )
        self.kv = PagedKV(backend, caches, block_size)
        for cache in caches:  # refused here rather than at the first tree step
            self.kv.row_layout(cache)
        if self.config.cost_rule:
            self.cost, self.cost_frozen = agree_across_ranks(profile_forward_cost(runner))
        return backend

    def step_cost(self) -> StepCost:
        """The forward-cost model (the bundled CPU profile until the engine's own exists)."""
        if self.cost is None:
            self.cost = fallback_cost()
        return self.cost

    # -- step hooks, in the order vLLM calls them -----------------------------------------
    def on_update_states(self, scheduler_output: Any) -> None:
        self.batch = None
        self.forget(scheduler_output.finished_req_ids)
        preempted = getattr(scheduler_output, "preempted_req_ids", None) or set()
        resumed = scheduler_output.scheduled_cached_reqs.resumed_req_ids
        self.on_preempted(set(preempted) | set(resumed))

    def on_prepare_inputs(self, scheduler_output: Any, result: tuple) -> tuple:
        """Lay out trees, fix positions, choose logits rows; returns ``_prepare_inputs``' result."""
        self.batch = None
        self.outcomes.clear()
        spec = scheduler_output.scheduled_spec_decode_tokens
        self._step_clock = None
        self._decode_step = self.config.cost_rule and _decode_only(scheduler_output)  # cost model, gate
        if self.config.cost_rule and self._decode_step:
            self._step_clock = (time.perf_counter(), int(scheduler_output.total_num_scheduled_tokens), 0)
        if not spec:
            return result
        runner = self.runner
        ib = runner.input_batch
        num_reqs = ib.num_reqs
        qsl = runner.query_start_loc.np[: num_reqs + 1]
        batch = build_tree_batch(
            req_ids=list(ib.req_ids),
            scheduled_spec=spec,
            pending=self.pending,
            query_start_loc=qsl,
            num_scheduled=np.diff(qsl),
            num_computed=ib.num_computed_tokens_cpu[:num_reqs],
            device=runner.device,
        )
        if batch is None:
            return result
        rows, positions = batch.positions_update()
        runner.positions[torch.from_numpy(rows).to(runner.device)] = torch.from_numpy(positions).to(
            device=runner.device, dtype=runner.positions.dtype
        )
        table = ib.block_table[0]
        batch.slot_mapping = table.slot_mapping.gpu[: int(qsl[-1])]
        batch.block_table = table.get_device_tensor(num_reqs)
        batch.kv = self.kv
        self.batch = batch
        if self._step_clock is not None:
            rows = sum(tr.num_nodes - tr.first_branch_node for tr in batch.requests)
            self._step_clock = (*self._step_clock[:2], rows)
        _, spec_meta, max_sampled = result
        return batch.logits_indices, spec_meta, max_sampled

    def sample(self, logits: torch.Tensor, spec_decode_metadata: Any) -> Any | None:
        """This step's ``SamplerOutput``, or None to let vLLM's own ``_sample`` run; the step's time,
        sampling and verification included, goes to the cost model (:meth:`_time_step`)."""
        try:
            return self._sample(logits, spec_decode_metadata)
        finally:
            self._time_step(logits)

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
        for req_id, outcome in outcomes.items():
            self.stats.on_verified(outcome.num_nodes - 1, outcome.num_accepted, outcome.draft, outcome.path)
            self.report.on_verified(req_id, outcome)
            if outcome.draft is not None:
                self.outcomes[req_id] = outcome
            else:
                self.stats.foreign_drafts += 1
        seconds = time.perf_counter() - t0
        self.stats.verify_seconds += seconds
        self.report.verify_seconds += seconds
        if self.stats.maybe_log() and self.cost is not None:
            logger.info("lookahead: the draft rule's step cost: %s", self.cost.describe())
            if self.gate is not None:
                logger.info("lookahead: tokens/s drafting vs not, by requests in flight: %s", self.gate.describe())
        return output

    def _time_step(self, logits: torch.Tensor) -> None:
        """Feed the cost model the decode-only step that just ran, from ``_prepare_inputs`` through
        sampling and verification: what a draft token costs is its rows in the forward and its
        share of verifying them, and the draft rule weighs both."""
        clock, self._step_clock = self._step_clock, None
        if clock is None or self.cost_frozen:
            return
        if logits.device.type == "cuda":
            torch.cuda.synchronize(logits.device)
        start, tokens, rows = clock
        self.step_cost().observe(tokens, rows, time.perf_counter() - start)

    def propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[list[int]]:
        """Observe this step's outcome per request and return next step's draft tokens (vLLM order)."""
        t0 = time.perf_counter()
        runner = self.runner
        decoding = sum(1 for s in sampled_token_ids if s)
        budget = self.config.draft_budget(decoding)
        can_draft = budget != 0 and (budget is not None or self._any_draft_pays(decoding))
        gated = budget is None and not self._gate(t0, decoding, sampled_token_ids, can_draft)
        can_draft = can_draft and not gated
        drafts: list[list[int]] = []
        undrafted = self.report.undrafted
        wanted: list[tuple[int, str, RequestLookahead, StepCandidates, bool, int, Any]] = []
        rule = budget is None and self.config.cost_rule  # the draft rule sizes this step
        floor = lead_floor(self.step_cost(), decoding, self.config.lead_tokens) if rule and can_draft else 0.0
        for i, req_id in enumerate(runner.input_batch.req_ids):
            drafts.append([])
            new_tokens = sampled_token_ids[i] if i < len(sampled_token_ids) else []
            outcome = self.outcomes.pop(req_id, None)
            self.pending.pop(req_id, None)
            if not new_tokens or (not can_draft and outcome is None):
                # Nothing to draft this step (no new token, or a batch too full for drafts):
                # the pools catch up on the skipped tokens when the request drafts again.
                if new_tokens:
                    undrafted[req_id] = "measured_slower" if gated else "batch_full"
                continue
            num_tokens = int(num_tokens_no_spec[i])
            history = token_ids_cpu[i, :num_tokens]
            req_state = runner.requests[req_id]
            state = self.requests.get(req_id)
            if state is None:
                prompt = req_state.prompt_token_ids or []
                # the request's own settings (extra_args), validated where vLLM accepted it
                cfg, shared = request_overrides.for_request(self.config, req_state.sampling_params, self.shared)
                state = RequestLookahead(cfg, prompt, seed=window_seed(cfg.seed, prompt), shared=shared)
                self.requests[req_id] = state
            if outcome is not None:
                assert outcome.draft is not None
                state.observe(outcome.draft, outcome.num_nodes, outcome.argmax, new_tokens, history, outcome.path)
            else:
                state.catch_up(history)
            if not can_draft:
                undrafted[req_id] = "measured_slower" if gated else "batch_full"
                continue
            room, thinking, reason = self._room(i, req_state, new_tokens, history, budget)
            if room <= 0:
                undrafted[req_id] = reason
                continue
            sp = req_state.sampling_params
            chain = eligibility.chain_only(sp)  # structured output: vLLM masks chain positions only
            recent = history[max(0, len(history) - self.config.lookup_context) :]
            cands = state.step_candidates(int(new_tokens[-1]), recent, room, max_candidates=1 if chain else None,
                                          min_gain=floor)
            wanted.append((i, req_id, state, cands, chain, room, thinking))
        plans = None
        if rule and wanted:
            options = [state.draft_options(cands, window=not chain) for _, _, state, cands, chain, _, _ in wanted]
            plans = plan_step(options, self.step_cost(), base_tokens=decoding)
        for k, (i, req_id, state, cands, chain, room, thinking) in enumerate(wanted):
            # Random sampling tries a node's children in turn, so candidates sharing a prefix are
            # merged into one trie (a duplicate child could never be accepted); greedy keeps the config.
            sp = runner.requests[req_id].sampling_params
            merge = None if eligibility.is_greedy(sp) else True
            if plans is not None:
                plan = plans[k]
                draft = state.build(cands, lead=plan.lead, candidates=plan.candidates,
                                    window_columns=plan.window_columns, merge=merge, budget=room)
            else:  # a fixed cap: full trees within it
                draft = state.build(cands, candidates=None, window_columns=0 if chain else None, merge=merge, budget=room)
            tokens = draft.tree.draft_tokens[:room]
            if thinking is not None:
                # No marker token in a draft (a prefix of a tree in topological order is a tree).
                tokens = tokens[: thinking.cut(tokens)]
            if not tokens:
                undrafted[req_id] = "no_candidate"
                continue
            self.pending[req_id] = draft
            self.stats.on_propose(draft, len(tokens))
            drafts[i] = tokens
        seconds = time.perf_counter() - t0
        self.stats.propose_seconds += seconds
        self.report.propose_seconds += seconds
        return drafts

    def _gate(self, now: float, decoding: int, sampled_token_ids: list[list[int]], can_draft: bool) -> bool:
        """Whether the measured gate (:mod:`~vllm_lookahead.core.draft_gate`) lets the next step
        draft, once it has seen the decode-only step that ends with this proposal (False only
        when ``can_draft`` and the gate says no).  Not under tensor parallelism (``cost_frozen``):
        every rank must build the same trees, so no decision may rest on one rank's timings."""
        if self.gate is None or self.cost_frozen:
            return True
        if self._gate_clock is not None and self._decode_step:
            since, drafted = self._gate_clock
            self.gate.observe(decoding, sum(len(s) for s in sampled_token_ids), now - since, drafted)
        self._decode_step = False
        allowed = not can_draft or self.gate.allow(decoding)
        self._gate_clock = (now, can_draft and allowed)
        return allowed

    def _any_draft_pays(self, decoding: int) -> bool:
        """Whether even a certain draft token would raise the batch's tokens/s (the cost rule's
        test for a batch too full to draft; when it fails no request does any work)."""
        if decoding <= 0:
            return False
        cost = self.step_cost()
        base = cost.forward(decoding)
        return base > decoding * (cost.forward(decoding + 1) - base)

    def _room(self, i: int, req_state: Any, new_tokens: list[int], history: np.ndarray,
              budget: int | None) -> tuple[int, ThinkingLimit | None, str]:
        """Draft nodes the request may carry next step, its thinking-budget limit if any, and
        the reason (a metric label) when there is no room."""
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
        return room, thinking, eligibility.reason_label(reason) if reason is not None else "no_room"

    def attach_report(self, output: Any) -> Any:
        """vLLM's ``ModelRunnerOutput`` of this step carrying :meth:`take_report` in its field
        ``lookahead_report`` (declared by the patch table, :data:`~.patches.FIELDS`; pickled with the
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
        report.pool_ngrams = sum(state.pool_ngrams for state in self.requests.values())
        if self.shared is not None:
            report.pool_ngrams += self.shared.num_ngrams
        report.request_states = self.num_request_states
        return report.payload()

    @property
    def num_request_states(self) -> int:
        """Requests this worker keeps anything for (a pool and window, a pending draft or an
        outcome): the live ones only, once :meth:`forget` has run for finished and aborted ones."""
        return len(self.requests.keys() | self.pending.keys() | self.outcomes.keys())

    def thinking_limit(self) -> ThinkingLimit | None:
        """How deep thinking-budget requests may be drafted (None: vLLM has no reasoning config,
        so it ignores budgets).  Follows the input batch, which vLLM may rebuild at start-up."""
        holder = getattr(self.runner.input_batch, "thinking_budget_state_holder", None)
        if self._thinking is None or self._thinking.holder is not holder:
            self._thinking = ThinkingLimit.of(self.runner)
        return self._thinking

    # -- request lifecycle ---------------------------------------------------------------
    def forget(self, req_ids: Any) -> None:
        """Finished or aborted requests: drop everything kept for them."""
        for req_id in req_ids:
            self.requests.pop(req_id, None)
            self.pending.pop(req_id, None)
            self.outcomes.pop(req_id, None)

    def on_preempted(self, req_ids: Any) -> None:
        """A preempted request recomputes its KV; its draft is void, its pool stays useful."""
        for req_id in req_ids:
            self.pending.pop(req_id, None)
            self.outcomes.pop(req_id, None)
            state = self.requests.get(req_id)
            if state is not None and req_id in self.runner.requests:
                state.reset(self.runner.requests[req_id].prompt_token_ids or [])

    def _warn_once(self, reason: str) -> None:
        if reason not in self._warned:
            self._warned.add(reason)
            logger.warning("lookahead: requests with %s run without drafts (exact, no speedup)", reason)


def _decode_only(scheduler_output: Any) -> bool:
    """Whether every scheduled request decodes (one token plus its drafts): the steps whose
    time the cost model learns from (a prefill chunk's cost is not a decode step's)."""
    spec = scheduler_output.scheduled_spec_decode_tokens or {}
    counts = scheduler_output.num_scheduled_tokens
    return bool(counts) and all(n == 1 + len(spec.get(r, ())) for r, n in counts.items())
