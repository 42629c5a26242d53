"""One in-process vLLM engine per method, driven as a closed-loop load generator.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker),
so the benchmark can time the runner's phases directly: :class:`StepTimers`
wraps five ``GPUModelRunner`` methods for the engine's lifetime through the
plugin's own patch mechanism (:mod:`vllm_lookahead.engine.hooks.patching`: signature
checked, stacked on lookahead's patches, undone on close).  Every method, including no speculation, is timed by the same
wrappers, so the columns compare like with like:

* ``propose``: ``propose_draft_token_ids`` -- the drafter (vLLM ngram/suffix, or
  the lookahead window + pool); zero without speculation;
* ``verify``: ``_sample`` -- sampling, plus rejection sampling or lookahead's
  tree verification and KV compaction;
* ``prepare``: ``_prepare_inputs`` -- vLLM's input preparation (plus the tree
  batch for lookahead);
* ``step``: ``execute_model`` -- input preparation and the model forward (also
  kept per number of tokens in the forward, so methods can be compared at equal
  shapes: :attr:`StepTimers.forward_by_tokens`);
* ``sample``: ``sample_tokens`` -- everything after the forward in the runner:
  ``verify``, ``propose`` and vLLM's output bookkeeping;
* ``attention``: the CPU attention backend's ``forward``, every layer -- vLLM's
  kernel, plus lookahead's tree pass where a step has branching trees (part of
  ``step``).

:meth:`BenchEngine.run` also times each whole engine step (``engine.step()``:
scheduler, runner, output processing), so what is neither forward nor sampling
-- the scheduler and output processing -- is the remainder.

:meth:`BenchEngine.run` keeps ``concurrency`` requests in flight (a new one is
added as soon as one finishes), greedy or sampled at a temperature (request ``i``
seeded ``seed + i``), and records per request the time to the first token and the
generated token ids; counters come from vLLM's own metrics
(``vllm:generation_tokens``, ``vllm:spec_decode_*``) and, for lookahead, from the
runner's own counters in this process (``lookahead_*``: accepted tokens by source,
steps with the window, :mod:`vllm_lookahead.engine.metrics.stats`), read before and after.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.counters import counter_delta, engine_metrics
from benchmarks.engine_env import in_process_start

ENGINE_DEFAULTS: dict[str, Any] = dict(
    dtype="float32",
    gpu_memory_utilization=0.3,
    seed=0,
    disable_log_stats=False,
    enable_prefix_caching=False,  # repeats and methods must pay the same prefill
)

RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
# timer -> (runner method, its parameters in vLLM 0.32/0.33)
TIMED_METHODS = {
    "step": ("execute_model", ("self", "scheduler_output", "intermediate_tensors")),
    "prepare": ("_prepare_inputs", ("self", "scheduler_output", "num_scheduled_tokens")),
    "propose": (
        "propose_draft_token_ids",
        (
            "self",
            "scheduler_output",
            "sampled_token_ids",
            "sampling_metadata",
            "hidden_states",
            "sample_hidden_states",
            "aux_hidden_states",
            "spec_decode_metadata",
            "common_attn_metadata",
            "slot_mappings",
        ),
    ),
    "verify": ("_sample", ("self", "logits", "spec_decode_metadata")),
    "sample": ("sample_tokens", ("self", "grammar_output")),
}
# The attention timer wraps the backend's forward (stacked on lookahead's tree-attention patch).
ATTENTION = (
    "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward",
    (
        "self",
        "layer",
        "query",
        "key",
        "value",
        "kv_cache",
        "attn_metadata",
        "output",
        "output_scale",
        "output_block_scale",
    ),
)


class StepTimers:
    """Wall time spent in selected ``GPUModelRunner`` methods (this process only)."""

    def __init__(self) -> None:
        self.seconds = {k: 0.0 for k in (*TIMED_METHODS, "attention")}
        self.calls = {k: 0 for k in (*TIMED_METHODS, "attention")}
        # tokens in the forward -> [calls, seconds] of execute_model
        self.forward_by_tokens: dict[int, list[float]] = {}
        self._patches: Any = None

    def install(self) -> None:
        from vllm_lookahead.engine.hooks.patching import Patch, PatchSet

        timers = [(key, f"{RUNNER}.{name}", params) for key, (name, params) in TIMED_METHODS.items()]
        self._patches = PatchSet().apply(
            [
                Patch(
                    target,
                    params,
                    f"bench timer '{key}'",
                    lambda original, k=key: self._wrap(k, original),
                    tag="bench-timer",
                )
                for key, target, params in [*timers, ("attention", *ATTENTION)]
            ]
        )

    def uninstall(self) -> None:
        if self._patches is not None:
            self._patches.undo()
            self._patches = None

    def _wrap(self, key: str, original: Callable) -> Callable:
        seconds, calls, by_tokens = self.seconds, self.calls, self.forward_by_tokens
        keep_shape = key == "step"

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                seconds[key] += dt
                calls[key] += 1
                if keep_shape and len(args) > 1:
                    tokens = int(getattr(args[1], "total_num_scheduled_tokens", 0) or 0)
                    if tokens:
                        entry = by_tokens.setdefault(tokens, [0, 0.0])
                        entry[0] += 1
                        entry[1] += dt

        return timed

    def snapshot(self) -> dict[str, float]:
        """Flat counters: ``<key>_s``, ``<key>_calls`` and ``forward<T>_s`` / ``forward<T>_calls``
        per number of tokens T in the forward (differences of two snapshots are a run's)."""
        out = {**{f"{k}_s": v for k, v in self.seconds.items()}, **{f"{k}_calls": v for k, v in self.calls.items()}}
        for tokens, (n, sec) in self.forward_by_tokens.items():
            out[f"forward{tokens}_calls"] = float(n)
            out[f"forward{tokens}_s"] = sec
        return out


@dataclass
class RunResult:
    """One workload (prompts x concurrency) through one engine, once."""

    wall_s: float
    ttft_s: list[float]  # per request, in prompt order
    latency_s: list[float]
    outputs: list[list[int]]  # generated token ids, in prompt order
    counters: dict[str, float]  # vLLM metric deltas over the run
    timers: dict[str, float]  # StepTimers deltas over the run
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)


class BenchEngine:
    """An in-process LLM with step timers; :meth:`close` frees it for the next method."""

    def __init__(self, model: str, speculative_config: dict | None, **engine_kwargs: Any) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        from vllm import LLM

        from benchmarks.methods import engine_arguments

        kwargs = {**ENGINE_DEFAULTS, **engine_kwargs, **engine_arguments(speculative_config)}
        with in_process_start():  # a replay before may have loaded numba
            self.llm = LLM(model=model, **kwargs)
        self.timers = StepTimers()
        self.timers.install()
        self._next_id = 0

    def tokenizer(self):
        return self.llm.get_tokenizer()

    def metrics(self) -> dict[str, float]:
        """vLLM's metrics, plus lookahead's counters when its runner lives in this process."""
        from vllm_lookahead.engine.hooks.step_context import live_stats

        stats = live_stats()
        return {**engine_metrics(self.llm), **(stats.snapshot() if stats is not None else {})}

    def run(
        self,
        prompts: Sequence[list[int]],
        concurrency: int,
        max_tokens: int,
        on_finish: Callable[[], None] | None = None,
        temperature: float = 0.0,
        seed: int = 0,
        ignore_eos: bool = False,
    ) -> RunResult:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine

        def params_for(i: int) -> SamplingParams:
            if not temperature:
                return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
            return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed + i, ignore_eos=ignore_eos)

        n = len(prompts)
        added = [0.0] * n
        first = [0.0] * n
        done = [0.0] * n
        outputs: list[list[int]] = [[] for _ in range(n)]
        index_of: dict[str, int] = {}
        next_prompt = 0
        in_flight = 0
        before_m, before_t = self.metrics(), self.timers.snapshot()
        engine_steps, engine_step_s = 0, 0.0
        t_start = time.perf_counter()
        while next_prompt < n or in_flight:
            while in_flight < concurrency and next_prompt < n:
                rid = f"bench-{self._next_id}"
                self._next_id += 1
                index_of[rid] = next_prompt
                added[next_prompt] = time.perf_counter()
                engine.add_request(
                    rid, TokensPrompt(prompt_token_ids=list(prompts[next_prompt])), params_for(next_prompt)
                )
                next_prompt += 1
                in_flight += 1
            t_step = time.perf_counter()
            step_outputs = engine.step()
            engine_step_s += time.perf_counter() - t_step
            engine_steps += 1
            for out in step_outputs:
                i = index_of.get(out.request_id)
                if i is None:
                    continue
                now = time.perf_counter()
                if not first[i] and out.outputs and len(out.outputs[0].token_ids):
                    first[i] = now
                if out.finished:
                    done[i] = now
                    outputs[i] = list(out.outputs[0].token_ids)
                    in_flight -= 1
                    if on_finish is not None:
                        on_finish()
        wall = time.perf_counter() - t_start
        return RunResult(
            wall_s=wall,
            ttft_s=[f - a for f, a in zip(first, added)],
            latency_s=[d - a for d, a in zip(done, added)],
            outputs=outputs,
            counters=counter_delta(before_m, self.metrics()),
            timers={
                **counter_delta(before_t, self.timers.snapshot()),
                "engine_step_s": engine_step_s,
                "engine_step_calls": float(engine_steps),
            },
        )

    def close(self) -> None:
        self.timers.uninstall()
        try:
            self.llm.llm_engine.engine_core.shutdown()
        finally:
            del self.llm
            gc.collect()
