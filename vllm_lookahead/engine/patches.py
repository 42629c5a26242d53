"""Every vLLM method lookahead replaces, in one place (vLLM 0.32/0.33, V1 runner).

Each patch names the symbol it replaces, keeps the original (``__wrapped__``) and
calls it; lookahead work happens only when the runner's drafter is our
:class:`~vllm_lookahead.engine.proposer.LookaheadProposer`, so an engine without
lookahead behaves exactly as stock vLLM.  Why each one is needed:

``GPUModelRunner._update_states``
    free per-request lookahead state on finish/abort, void drafts on preemption.
``GPUModelRunner._prepare_inputs``
    vLLM derives RoPE positions from the linear row index and assumes drafts are
    a chain; draft rows need ``context + tree depth`` and only some rows need logits.
``GPUModelRunner.execute_model``
    make the step's trees visible to the attention wrapper during the forward only.
``GPUModelRunner._sample``
    the rejection sampler verifies linear drafts; trees need tree verification
    and KV compaction (see :mod:`.verify_step`); steps without any draft use
    vLLM's plain sampler, as an engine without speculation would.
``SamplingParams._validate_spec_decode`` (in :mod:`.config_hook`)
    vLLM refuses min_p/logit_bias with speculation; lookahead serves them undrafted.
``gpu_model_runner.apply_grammar_bitmask``
    locates each structured-output request's logits rows assuming ``1 + drafts`` rows per
    request; tree requests own fewer rows, so it is shown the tree layout.
``gpu_model_runner.build_logitsprocs``
    with any speculative config vLLM builds only the min_tokens logits processor;
    lookahead samples undrafted rows with the plain sampler, which needs them all.
``GPUModelRunner._input_fits_in_drafter``
    vLLM zeroes every request's draft when any is within ``num_speculative_tokens``
    of ``max_model_len``; the lookahead proposer trims per request instead.
``GPUModelRunner.initialize_kv_cache``
    check the model's attention is one the tree path reproduces; pin the cache layout.
``<Backend>Impl.forward`` (CPU_ATTN, FLASH_ATTN, TRITON_ATTN)
    vLLM ships no tree attention: recompute draft rows with the tree mask
    (:mod:`.attention`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Callable

from vllm_lookahead.engine import attention, runner as la_runner
from vllm_lookahead.engine.config_hook import is_lookahead_config
from vllm_lookahead.engine.verify_step import verify_step


_ATTENTION_IMPLS = {
    "CPU_ATTN": ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl"),
    "FLASH_ATTN": ("vllm.v1.attention.backends.flash_attn", "FlashAttentionImpl"),
    "TRITON_ATTN": ("vllm.v1.attention.backends.triton_attn", "TritonAttentionImpl"),
}


def replace_method(owner: object, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``owner.name`` (a class's own method or a module's function, as the module
    itself looks it up) by ``make(original)`` once; the original stays as ``__wrapped__``."""
    original = owner.__dict__[name]
    if getattr(original, "__lookahead_patch__", False):
        return
    new = make(original)
    functools.update_wrapper(new, original)
    new.__wrapped__ = original  # type: ignore[attr-defined]
    new.__lookahead_patch__ = True  # type: ignore[attr-defined]
    setattr(owner, name, new)


def _update_states(original):
    def patched(self, scheduler_output):
        result = original(self, scheduler_output)
        la_runner.after_update_states(self, scheduler_output)
        return result

    return patched


def _prepare_inputs(original):
    def patched(self, scheduler_output, num_scheduled_tokens):
        result = original(self, scheduler_output, num_scheduled_tokens)
        return la_runner.after_prepare_inputs(self, scheduler_output, result)

    return patched


def _execute_model(original):
    def patched(self, scheduler_output, *args, **kwargs):
        la = la_runner.get_lookahead(self)
        if la is None:
            return original(self, scheduler_output, *args, **kwargs)
        la.batch = None
        # _prepare_inputs (inside this call) sets la.batch; the attention wrapper
        # reads it through the provider, only while this forward runs.
        with attention.active_tree_batch(lambda: la.batch, la.backend or ""):
            return original(self, scheduler_output, *args, **kwargs)

    return patched


def _sample(original):
    def patched(self, logits, spec_decode_metadata):
        la = la_runner.get_lookahead(self)
        if la is None or logits is None:
            return original(self, logits, spec_decode_metadata)
        if la.batch is None:
            if spec_decode_metadata is not None and not any(spec_decode_metadata.num_draft_tokens):
                # No drafts anywhere in the batch: sample exactly as vLLM without
                # speculation does (its rejection sampler skips logits processors
                # such as min_p/logit_bias, which lookahead lets through).
                self.input_batch.update_async_output_token_ids()
                return self.sampler(logits=logits, sampling_metadata=self.input_batch.sampling_metadata)
            return original(self, logits, spec_decode_metadata)
        batch, la.batch = la.batch, None
        self.input_batch.update_async_output_token_ids()
        return verify_step(self, logits, batch, la.proposer, la.backend, la.layer_caches)

    return patched


def _input_fits_in_drafter(original):
    def patched(self, common_attn_metadata):
        if la_runner.get_lookahead(self) is not None:
            return common_attn_metadata is not None
        return original(self, common_attn_metadata)

    return patched


def _initialize_kv_cache(original):
    def patched(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        la = la_runner.get_lookahead(self)
        if la is not None:
            la.setup_kv(self)
            _patch_attention_impl(la.backend)
        return result

    return patched


def _patch_attention_impl(backend: str) -> None:
    module_name, cls_name = _ATTENTION_IMPLS[backend]
    cls = getattr(importlib.import_module(module_name), cls_name)
    replace_method(cls, "forward", attention.wrap_forward)


class _WithoutSpeculation:
    """A read-only view of a VllmConfig that reports no speculative config."""

    speculative_config = None

    def __init__(self, config: object) -> None:
        self._config = config

    def __getattr__(self, name: str):
        return getattr(self._config, name)


def _build_logitsprocs(original):
    def patched(vllm_config, *args, **kwargs):
        spec = getattr(vllm_config, "speculative_config", None)
        if is_lookahead_config(spec):
            vllm_config = _WithoutSpeculation(vllm_config)
        return original(vllm_config, *args, **kwargs)

    return patched


def _apply_grammar_bitmask(original):
    def patched(scheduler_output, grammar_output, input_batch, logits):
        batch = la_runner.current_tree_batch()
        if batch is not None:
            spec = batch.logits_rows_as_drafts(scheduler_output.scheduled_spec_decode_tokens)
            scheduler_output = dataclasses.replace(scheduler_output, scheduled_spec_decode_tokens=spec)
        return original(scheduler_output, grammar_output, input_batch, logits)

    return patched


def install() -> None:
    """Install all runner patches (idempotent; safe in every vLLM process)."""
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    replace_method(gpu_model_runner, "build_logitsprocs", _build_logitsprocs)
    replace_method(gpu_model_runner, "apply_grammar_bitmask", _apply_grammar_bitmask)

    for name, make in (
        ("_update_states", _update_states),
        ("_prepare_inputs", _prepare_inputs),
        ("execute_model", _execute_model),
        ("_sample", _sample),
        ("_input_fits_in_drafter", _input_fits_in_drafter),
        ("initialize_kv_cache", _initialize_kv_cache),
    ):
        replace_method(GPUModelRunner, name, make)
