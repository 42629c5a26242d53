"""Lookahead's worker-side path, step by step, on a stand-in for vLLM's GPU model runner.

The engine's own :class:`~vllm_lookahead.engine.runner.RunnerLookahead` runs every hook a decode
step calls, in the engine's order, over ``batch`` requests served continuously (a request that
ends is replaced by the next stream, whose prompt is computed in chunks within vLLM's token budget,
:mod:`.served`):

``update``     :meth:`~RunnerLookahead.on_update_states` (finished requests forgotten, new
               requests' states queued for the worker thread, which gets them and the finished
               ones' to release once the forward is launched, as on a GPU server)
``tree batch`` :meth:`~RunnerLookahead.on_prepare_inputs`: the step's trees laid out, RoPE
               positions rewritten, logits rows chosen
``attention``  the tree-attention metadata the step's first attention layer builds on a GPU
               (the Triton kernel's launch plan over :attr:`TreeBatch.branching`,
               :func:`~vllm_lookahead.engine.step.attention.kernel_plan`, for a Llama-3.1-8B layer:
               32 query heads, 8 KV heads, head size 128, bf16)
``verify``     the host's part of verification (:func:`~vllm_lookahead.engine.step.verification.
               verify_trees` with the accepted paths' KV moves listed,
               :meth:`~RunnerLookahead.on_verified`, the emitted-token grid)
``propose``    :meth:`~RunnerLookahead.propose`: windows slide, pools learn, the draft rule sizes
               the step, trees are built
``report``     :meth:`~RunnerLookahead.take_report`: the step's report for the scheduler

What the device does is not here (``device_time``: the engine thread sleeps through each step's
forward as the cost model prices it, between the attention and verify phases; without it the new
requests' states the step started are built there, untimed, as the engine's worker thread builds
them while the forward runs; ``between``, if set, runs there too: the engine check's stand-in for a
forward on this CPU): the forward, each
tree node's argmax and vLLM's sample at the roots (greedy: read off the recording, as greedy
output does not depend on the drafts), the KV copies themselves.  Greedy, every emitted token is
checked against the recording, so a replay that ran is an exact one.  Sampled (``temperature`` >
0), the rows come from a model peaked at the recording (:mod:`.sampled_model`), vLLM's sample at
the roots is drawn from them, and the walks of verification run on them, on CPU tensors, as for
requests without a seed (each position sampled by
:func:`~vllm_lookahead.engine.step.sampler_noise.inverse_cdf`; a seeded request's would draw the
noise of vLLM's GPU sampler, ``exponential``).
The draft rule prices trees with a GPU's forward-cost model (``cost``), not refined by the replay
(no forward runs); its verification price and idle rests learn from the replay's own host time, as
on a server.
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from benchmarks.host_work.sampled_model import PeakedModel, compact
from benchmarks.host_work.served import MAX_NUM_BATCHED_TOKENS, ServedBatch
from benchmarks.host_work.streams import Stream

if TYPE_CHECKING:
    from vllm_lookahead.engine.step.verification import KeptRows

PHASES = ("update", "tree batch", "attention", "verify", "propose", "report")
BLOCK_SIZE = 16
# A Llama-3.1-8B attention layer (the GPU check's shape): the kernel plan's geometry.
HEADS, KV_HEADS, HEAD_SIZE = 32, 8, 128


class CollectorClock:
    """Seconds the garbage collector has run in this process since :meth:`install` (a
    ``gc.callbacks`` pair: every collection, of any generation, timed from start to stop)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def install(self) -> CollectorClock:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


@dataclass
class StepTimes:
    """Seconds per phase of every measured step, and what each step carried."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    collector: list[float] = field(default_factory=list)  # of the phases' seconds, the garbage collector's
    decoding: list[int] = field(default_factory=list)  # requests decoding (not prefilling) per step
    draft_tokens: list[int] = field(default_factory=list)  # draft tokens the step ran
    emitted: list[int] = field(default_factory=list)  # tokens the decoding requests emitted
    # device_time: how long past the modelled forward the engine thread got the interpreter back
    stall: list[float] = field(default_factory=list)

    def totals(self) -> np.ndarray:
        return np.sum([self.seconds[p] for p in PHASES], axis=0)


class _Table:
    """vLLM's block table as the tree path reads it: the step's slot mapping and the table."""

    def __init__(self, max_tokens: int, max_reqs: int, max_blocks: int) -> None:
        self.slot_mapping = SimpleNamespace(gpu=torch.arange(max_tokens, dtype=torch.int64))
        self._table = torch.zeros((max_reqs, max_blocks), dtype=torch.int32)

    def get_device_tensor(self, num_reqs: int) -> torch.Tensor:
        return self._table[:num_reqs]


class _KV:
    """The paged KV cache as verification reaches it: the accepted paths' moves are counted."""

    block_size = BLOCK_SIZE

    def __init__(self) -> None:
        self.moves = 0

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.moves += int(src.numel())


def _compile_loops(config: Any) -> None:
    """The pools' loops compiled for ``config``, the draft rule's and the sampled walks', before
    the first step, as the engine's start-up does (``RunnerLookahead.setup_kv``); a version of the
    package without ``compile_pools``, ``compile_plan`` or ``compile_walks`` compiles them on first use."""
    from vllm_lookahead.core import draft_rule, request_text, sampling

    compile_pools = getattr(request_text, "compile_pools", None)
    if compile_pools is not None:
        compile_pools(config)
    compile_plan = getattr(draft_rule, "compile_plan", None)
    if compile_plan is not None:
        compile_plan()
    compile_walks = getattr(sampling, "compile_walks", None)
    if compile_walks is not None:
        compile_walks()


class LookaheadReplay:
    """``batch`` requests in flight over ``streams`` (cycled), lookahead with the user's ``keys``."""

    def __init__(
        self,
        streams: list[Stream],
        batch: int,
        keys: dict[str, Any],
        cost: Any,
        max_model_len: int,
        max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
        temperature: float = 0.0,
        device_time: bool = False,
    ):
        from vllm import SamplingParams

        from vllm_lookahead.engine.hooks.proposer import LookaheadProposer
        from vllm_lookahead.engine.runner import RunnerLookahead
        from vllm_lookahead.engine.step.sampler_noise import SamplerNoise

        sampled = temperature > 0
        vocab = 0
        if sampled:  # rows over the streams' own tokens (sampled_model)
            streams, vocab = compact(streams)
            # vLLM's sampler ops, which verification calls: loaded in an engine (its Sampler's), not timed here
            import vllm.v1.sample.ops.topk_topp_sampler  # noqa: F401
        self.streams, self.batch, self.max_model_len = streams, batch, max_model_len
        model = SimpleNamespace(max_model_len=max_model_len, uses_mrope=False, logits_processors=None)
        vllm_config = SimpleNamespace(
            additional_config={"lookahead": dict(keys)},
            model_config=model,
            device_config=SimpleNamespace(device_type="cuda"),
        )
        self.runner = SimpleNamespace(
            vllm_config=vllm_config,
            model_config=model,
            drafter=LookaheadProposer(vllm_config),
            device=torch.device("cpu"),
            requests={},
            positions=torch.zeros(1, dtype=torch.int64),
            query_start_loc=SimpleNamespace(np=np.zeros(batch + 1, dtype=np.int32)),
            input_batch=SimpleNamespace(
                req_ids=[],
                num_reqs=batch,
                num_computed_tokens_cpu=np.zeros(batch, dtype=np.int32),
                block_table=[_Table(1, batch, -(-max_model_len // BLOCK_SIZE))],
                thinking_budget_state_holder=None,
            ),
        )
        state = RunnerLookahead.of(self.runner)
        assert state is not None
        state.hand_over_at_sample = True  # a GPU server's order: the worker's share once the forward is launched
        self.state = state
        self.kv = state.kv = _KV()
        state.timing.cost = cost  # the GPU's forward; the replay runs none, so nothing refines it
        # the engine thread waits through each step's forward as ``cost`` prices it (the interpreter
        # released, as while a GPU runs), rather than going straight to the next phase
        self.forward = copy.deepcopy(cost) if device_time else None
        # run where the forward goes, on the engine thread (engine_check: what a CPU forward does to the caches)
        self.between: Callable[[], None] | None = None
        _compile_loops(state.config)
        self._sm = SimpleNamespace(
            all_greedy=not sampled,
            all_random=sampled,
            temperature=torch.full((batch,), temperature),
            top_k=None,
            top_p=None,
            max_num_logprobs=None,
            allowed_token_ids_mask=None,
            bad_words_token_ids=None,
            no_penalties=True,
            generators={},
        )
        # sampled: rows from a model peaked at the recording, walks with a GPU sampler's noise
        self._model = PeakedModel(vocab, temperature) if sampled else None
        self._noise = SamplerNoise("exponential") if sampled else None
        self.served = ServedBatch(
            streams,
            batch,
            max_model_len,
            SamplingParams(temperature=temperature, max_tokens=max_model_len),
            max_num_batched_tokens,
            follows_recording=not sampled,
        )
        self.runner.requests = self.served.requests
        self.runner.input_batch.req_ids = self.served.req_ids
        self._drafts: list[list[int]] = [[] for _ in range(batch)]
        self.collector = CollectorClock().install()  # how much of the phases the garbage collector took

    # -- one step ------------------------------------------------------------------------
    def step(self, times: StepTimes | None) -> None:
        """One engine step over the batch; its phases' host time into ``times`` (None: warm-up)."""
        from vllm_lookahead.engine.step.attention import kernel_plan
        from vllm_lookahead.engine.step.verification import plan_trees, verify_trees

        runner, state, served = self.runner, self.state, self.served
        slots = served.slots
        decoding = sum(not s.prefill for s in slots)
        scheduled = served.schedule(self._drafts)
        spec = {s.req_id: d for s, d in zip(slots, self._drafts) if d and not s.prefill}
        qsl = runner.query_start_loc.np
        qsl[0] = 0
        np.cumsum(scheduled, out=qsl[1:])
        total = int(qsl[-1])
        if runner.positions.numel() < total:
            runner.positions = torch.zeros(2 * total, dtype=torch.int64)
            table = runner.input_batch.block_table[0]
            table.slot_mapping.gpu = torch.arange(2 * total, dtype=torch.int64)
        runner.input_batch.num_computed_tokens_cpu[:] = [
            s.computed if s.prefill else len(s.stream.prompt) + s.emitted - 1 for s in slots
        ]
        sched = SimpleNamespace(
            scheduled_spec_decode_tokens=spec,
            has_structured_output_requests=False,
            total_num_scheduled_tokens=total,
            num_scheduled_tokens={s.req_id: int(n) for s, n in zip(slots, scheduled)},
            finished_req_ids=served.finished,
            scheduled_new_reqs=served.scheduled_new,
            preempted_req_ids=set(),
            scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()),
        )
        clock: dict[str, float] = {}
        collected = [0.0]  # the garbage collector's seconds within the phases
        now = self._now

        def lap(phase: str, since: tuple[float, float]) -> None:
            clock[phase] = time.perf_counter() - since[0]
            collected[0] += self.collector.seconds - since[1]

        t = now()
        state.on_update_states(sched)
        lap("update", t)

        t = now()
        state.on_prepare_inputs(sched, (None, None, 0))
        batch = state.batch
        lap("tree batch", t)

        t = now()
        if batch is not None and batch.needs_tree_attention:
            kernel_plan(batch, HEADS, KV_HEADS, HEAD_SIZE, torch.bfloat16)
        lap("attention", t)
        # the forward is launched: the engine's sample hook hands the worker its share (timed with verify)
        t = now()
        state.builds.hand_over()
        handed_over = time.perf_counter() - t[0]
        if self.forward is not None:
            self._wait_forward(total, batch, times)
        else:
            self._builds_in_forward()
        if self.between is not None:
            self.between()

        roots = self._roots()  # vLLM's sample at every root (the device's)
        outputs: list[list[int]] = [[r] for r in roots]
        t = now()
        if batch is not None:
            state.batch = None  # taken by the step's sampling, as in the engine
            argmax, kept = self._tree_outputs(batch)  # the device's: every node's argmax, sampled rows
            t = now()
            verified = verify_trees(
                self._sm, batch, plan_trees(runner.requests, self._sm, batch), kept, argmax, roots, self._noise
            )
            state.on_verified(verified.outcomes)
            verified.token_grid(max(len(o) for o in verified.outputs))
            outputs = verified.outputs
            state.report.verify_seconds += time.perf_counter() - t[0]
        lap("verify", t)
        clock["verify"] += handed_over

        # a prompt whose last chunk did not run emits nothing (vLLM discards its sample)
        outputs = [o if s.emits else [] for s, o in zip(slots, outputs)]
        emitted = served.advance(outputs)

        t = now()
        self._drafts = state.propose(outputs, served.num_tokens, served.token_ids)
        lap("propose", t)

        t = now()
        state.take_report()
        lap("report", t)

        if times is not None:
            for p in PHASES:
                times.seconds[p].append(clock[p])
            times.collector.append(collected[0])
            times.decoding.append(decoding)
            times.draft_tokens.append(sum(len(d) for d in spec.values()))
            times.emitted.append(emitted)
        for i in served.replace_finished():
            self._drafts[i] = []
        runner.input_batch.req_ids = served.req_ids

    def _wait_forward(self, tokens: int, batch: Any, times: StepTimes | None) -> None:
        """Sleep through the step's modelled forward; the time past it is the engine thread's stall
        (the scheduler's wake-up and any wait for the interpreter, which another thread held)."""
        rows = sum(tr.num_nodes - tr.first_branch_node for tr in batch.requests) if batch is not None else 0
        seconds = self.forward.forward(tokens, rows)
        t = time.perf_counter()
        time.sleep(seconds)
        if times is not None:
            times.stall.append(time.perf_counter() - t - seconds)

    def _builds_in_forward(self) -> None:
        """The worker's share of this step's turnover (:class:`~vllm_lookahead.engine.propose.
        state_builds.StateBuilds`: new requests' states built, finished ones' released), done where
        the forward goes and not timed: in the engine the worker thread does it while the forward
        runs, with the interpreter released (a short
        prompt's in ~0.1 ms, an 8k-token one's in ~3 ms, against a forward of 8-11 ms or more on a
        GPU; ``device_time`` sleeps through the forward instead and reports any stall past it).
        Back to back, the worker would rarely get the interpreter before the first proposal, which
        would then build the state itself, or hold it in the middle of another phase."""
        self.state.builds.settle()

    def _now(self) -> tuple[float, float]:
        """The time, and the garbage collector's seconds so far."""
        return time.perf_counter(), self.collector.seconds

    def _roots(self) -> list[int]:
        """vLLM's sample at every request's root: the recording's next token (greedy), or a draw
        from the peaked model's row with the sampler's noise."""
        if self._model is None:
            return self.served.next_tokens()
        assert self._noise is not None
        slots = self.served.slots
        rows = torch.cat([self._model.rows(s.stream.output, np.array([s.emitted])) for s in slots])
        return self._noise.sample_rows(rows / self._sm.temperature[: len(slots), None], [None] * len(slots))

    def _tree_outputs(self, batch: Any) -> tuple[np.ndarray, KeptRows | None]:
        """Every tree node's argmax (``tree_logit_rows`` order) and, sampled, the tree requests'
        rows (their verification reads them), one tensor as the engine's gather makes it."""
        from vllm_lookahead.engine.step.verification import KeptRows

        if self._model is None:
            return self._tree_argmax(batch), None
        argmax, rows, blocks, at = [], [], {}, 0
        for tr in batch.requests:
            slot = self.served.slots[tr.batch_index]
            positions = slot.emitted + tr.tree.depths[tr.logit_nodes]
            argmax.append([self._model.said(slot.stream.output, int(p)) for p in positions])
            rows.append(self._model.rows(slot.stream.output, positions))
            blocks[tr.req_id] = (at, len(positions))
            at += len(positions)
        return np.concatenate(argmax).astype(np.int64), KeptRows(torch.cat(rows), blocks)

    def _tree_argmax(self, batch: Any) -> np.ndarray:
        """What the target model says at every tree node with logits (``tree_logit_rows`` order):
        the recorded next token where the node's path is the recorded continuation, else a token
        off it (the recording's token one further on)."""
        out = []
        for tr in batch.requests:
            slot = self.served.slots[tr.batch_index]
            text, at = slot.stream.output, slot.emitted
            tokens, parents, depths = tr.tree.tokens, tr.tree.parents, tr.tree.depths
            on_path = np.zeros(tr.num_nodes, dtype=bool)
            on_path[0] = True
            said = np.empty(tr.num_nodes, dtype=np.int64)
            for node in range(tr.num_nodes):
                d = int(depths[node])
                if node:
                    on_path[node] = (
                        on_path[parents[node]] and at + d - 1 < len(text) and tokens[node] == text[at + d - 1]
                    )
                right = text[at + d] if at + d < len(text) else text[-1]
                if on_path[node]:
                    said[node] = right
                else:
                    other = text[(at + d + 1) % len(text)]
                    said[node] = other if other != right else right + 1
            out.append(said[tr.logit_nodes])
        return np.concatenate(out)


# The prices :func:`fix_prices` holds the draft rule to: what the measured ones come to at 32 in
# flight on the 2-core CPU (per request proposed for; per greedy or sampled tree verified; per
# sampled token accepted).
FIXED_PROPOSAL_S, FIXED_VERIFY_S, FIXED_SAMPLED_TOKEN_S = 100e-6, 50e-6, 300e-6


def fix_prices(replay: LookaheadReplay) -> None:
    """Hold the draft rule's host prices (proposing per request, verifying per tree, sampling per
    accepted token) at fixed values instead of the replay's measured times, so that two runs --
    two versions of the code, or one on a machine whose speed moves -- make the same decisions
    step by step (``python -m benchmarks.host_work.ab``)."""
    timing = replay.state.timing
    proposed_for, verified = timing.proposed_for, timing.verified
    timing.proposed_for = lambda seconds, requests: proposed_for(FIXED_PROPOSAL_S * requests, requests)
    timing.verified = lambda outcomes: verified(
        [
            SimpleNamespace(
                greedy=o.greedy,
                path=o.path,
                seconds=FIXED_VERIFY_S,
                sampling_seconds=FIXED_SAMPLED_TOKEN_S * len(o.path),
            )
            for o in outcomes
        ]
    )
