"""Engine start-up: accept ``{"method": "lookahead", ...}`` and refuse what cannot work.

vLLM 0.32's ``SpeculativeConfig.method`` is a closed ``Literal`` and the config
forbids unknown keys, so the user's dict cannot reach it as is.  When vLLM builds
its engine config (``EngineArgs.create_engine_config``, used by ``vllm serve``,
``LLM(...)`` and ``AsyncEngineArgs`` alike; replaced in :mod:`.patches`):

before vLLM's code (:func:`prepare_engine_args`)
    the lookahead dict is validated by :class:`~vllm_lookahead.config.LookaheadConfig`
    (one line naming field, value and range), stored in
    ``additional_config["lookahead"]`` (vLLM's documented plugin slot, shipped to
    every engine and worker process) and replaced by vLLM's documented
    ``method="custom_class"`` proposer hook with ``num_speculative_tokens`` = the
    largest tree (it sizes the scheduler's budget and the per-position acceptance
    stats; ``custom_class`` also turns async scheduling off, as CPU-side drafting
    needs).  FULL CUDA graphs are turned into PIECEWISE ones (:func:`tree_safe_cudagraph_mode`);
after vLLM's code (:func:`check_engine_config`)
    the finished ``VllmConfig`` is refused, with the setting to change, when the
    plugin's V1-runner patches would silently not run or not be right: Model
    Runner V2, pipeline parallelism, decode context parallelism, FULL CUDA graphs --
    and a lookahead config whose largest step cannot fit the engine's
    ``max_num_batched_tokens`` or ``max_model_len`` (:func:`step_size_problems`); under data
    parallelism it gets back the draft-length schedule vLLM drops (:func:`restore_draft_schedule`).

Model Runner V2 (``vllm/v1/worker/gpu/``) is vLLM's default on GPU; vLLM 0.32 and
0.33 (``VllmConfig.use_v2_model_runner``, identical in both) fall back to the V1
runner for ``custom_class`` -- unless ``VLLM_USE_V2_MODEL_RUNNER=1``, a watermark
config or HiSparse forces V2, whose speculator factory has no ``custom_class``
branch (``init_speculator`` raises "custom_class is not supported yet").
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_lookahead.config import (
    ABLATION_KEY,
    ADDITIONAL_CONFIG_KEY,
    METHOD_NAME,
    LookaheadConfig,
    LookaheadConfigError,
)

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format

PROPOSER_PATH = "vllm_lookahead.engine.hooks.proposer.LookaheadProposer"
MAX_BATCH = 1 << 20  # the end of the single batch-size range of the draft-length schedule


class LookaheadStartupError(LookaheadConfigError):
    """An engine configuration lookahead cannot run under (printed as one line at start-up)."""


def is_lookahead_request(spec: Any) -> bool:
    return isinstance(spec, dict) and str(spec.get("method", "")).lower() == METHOD_NAME


def is_lookahead_config(speculative_config: Any) -> bool:
    """Whether a vLLM ``SpeculativeConfig`` is the one :func:`translate` produced."""
    return speculative_config is not None and getattr(speculative_config, "model", None) == PROPOSER_PATH


def translate(
    spec: dict[str, Any], additional_config: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any], LookaheadConfig]:
    """(vLLM speculative dict, new additional_config, validated lookahead config).  A benchmark's or
    a test's :class:`~vllm_lookahead.config.Ablation` settings come in ``additional_config``
    under :data:`~vllm_lookahead.config.ABLATION_KEY`."""
    extra = dict(additional_config or {})
    cfg = LookaheadConfig.from_user_dict(spec, ablation=extra.pop(ABLATION_KEY, None))
    extra[ADDITIONAL_CONFIG_KEY] = cfg.model_dump()
    vllm_spec = {
        "method": "custom_class",
        "model": PROPOSER_PATH,
        "num_speculative_tokens": cfg.max_draft_tokens,
        # One schedule entry covering every batch size with the same K = static speculation as
        # far as draft lengths go.  Declaring it switches off vLLM's padding of a request whose
        # prompt is all in the prefix cache to 1 + K placeholder rows on its first decode step
        # ("to preserve full cudagraph", v1/core/sched/scheduler.py) -- with K = the largest
        # lookahead tree that is up to 83 rows of -1 tokens run through the model for nothing.
        "num_speculative_tokens_per_batch_size": [(1, MAX_BATCH, cfg.max_draft_tokens)],
    }
    return vllm_spec, extra, cfg


def tree_safe_cudagraph_mode(requested: Any, static_graphs: bool, enforce_eager: bool) -> tuple[Any, str | None]:
    """(cudagraph mode to set, log line) -- (None, None) to leave vLLM's choice alone.

    FULL CUDA graphs capture the attention call, so the tree-attention pass (eager
    Python between vLLM's kernel and the next layer) would be skipped on replay.
    PIECEWISE graphs leave attention outside the graphs, exactly where the pass runs.
    vLLM's own default on a GPU is FULL_AND_PIECEWISE; where the platform has no
    CUDA graphs or the model runs eagerly nothing is changed.  (PIECEWISE without
    ``torch.compile`` becomes NONE in vLLM's own config checks.)
    """
    from vllm.config.compilation import CUDAGraphMode

    if not static_graphs or enforce_eager:
        return None, None
    if isinstance(requested, str):
        requested = CUDAGraphMode[requested.upper()]
    if requested is None:
        return CUDAGraphMode.PIECEWISE, (
            "vllm-lookahead: cudagraph_mode PIECEWISE instead of vLLM's default (FULL_AND_PIECEWISE): "
            "tree attention runs eagerly between graph pieces and FULL graphs cannot capture it"
        )
    if requested.has_full_cudagraphs():
        return CUDAGraphMode.PIECEWISE, (
            f"vllm-lookahead: cudagraph_mode {requested.name} requested, using PIECEWISE: "
            "tree attention runs eagerly between graph pieces and FULL graphs cannot capture it"
        )
    return None, None


def prepare_engine_args(args: Any) -> LookaheadConfig | None:
    """Before vLLM builds its config from ``args`` (an ``EngineArgs``); None without lookahead."""
    if getattr(args, "spec_method", None) == METHOD_NAME:  # --spec-method lookahead
        args.speculative_config = {**(args.speculative_config or {}), "method": METHOD_NAME}
        args.spec_method = None
    if not is_lookahead_request(args.speculative_config):
        return None
    args.speculative_config, args.additional_config, cfg = translate(args.speculative_config, args.additional_config)
    logger.info("vllm-lookahead: speculative method 'lookahead' %s", cfg.summary())
    from vllm.platforms import current_platform

    compilation = args.compilation_config
    mode, message = tree_safe_cudagraph_mode(
        getattr(compilation, "cudagraph_mode", None),
        current_platform.support_static_graph_mode(),
        bool(getattr(args, "enforce_eager", False)),
    )
    if mode is not None:
        compilation.cudagraph_mode = mode
        logger.warning("%s", message)
    return cfg


def engine_config_problems(vllm_config: Any) -> list[str]:
    """Why lookahead cannot run under this ``VllmConfig`` (empty: it can), each naming the setting."""
    problems = []
    if vllm_config.use_v2_model_runner:
        if getattr(vllm_config.attention_config, "hisparse_config", None) is not None:
            why = "HiSparse (attention_config.hisparse_config) requires it"
        elif getattr(vllm_config, "watermark_config", None) is not None:
            why = "watermarking (--watermark-config) requires it"
        else:
            why = "VLLM_USE_V2_MODEL_RUNNER=1 forces it"
        problems.append(
            f"vLLM would run Model Runner V2 ({why}); lookahead patches the V1 model runner, which vLLM "
            "uses for method custom_class otherwise -- unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0) "
            "and drop the V2-only feature"
        )
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1:
        problems.append(
            f"pipeline parallelism (--pipeline-parallel-size {parallel.pipeline_parallel_size}) is not "
            "supported: the draft trees live on the last stage only; use tensor parallelism"
        )
    dcp = getattr(parallel, "decode_context_parallel_size", 1) or 1
    if dcp > 1:
        problems.append(
            f"decode context parallelism (--decode-context-parallel-size {dcp}) is not supported: "
            "tree attention reads each request's whole KV cache on one rank"
        )
    mode = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
    if mode is not None and mode.has_full_cudagraphs():
        problems.append(
            f"cudagraph_mode {mode.name} captures attention in FULL CUDA graphs, which cannot run the "
            "eager tree-attention pass; use -cc.cudagraph_mode=PIECEWISE or --enforce-eager"
        )
    return problems


def step_size_problems(
    cfg: LookaheadConfig, max_num_batched_tokens: int | None, max_model_len: int | None
) -> list[str]:
    """Why the config's largest step (the last token + ``cfg.max_draft_tokens``) can never run
    whole under these engine limits, each naming the limit and what to change.

    Per step the proposer still trims each request's tree to the token budget left in the batch
    and to the room before ``max_model_len`` (so a long request near the limit keeps decoding);
    what is refused here is a configuration whose trees could *never* be run as configured.
    The smallest request has a one-token prompt: its first decode step has
    ``max_model_len - 2`` positions left for drafts.
    """
    need = 1 + cfg.max_draft_tokens
    shape = (
        f"window_size {cfg.window_size}, ngram_size {cfg.ngram_size}, guess_set_size "
        f"{cfg.guess_set_size}, max_lead_tokens {cfg.max_lead_tokens}"
    )
    shrink = "or shrink window_size / guess_set_size / ngram_size / max_lead_tokens"
    problems = []
    if max_num_batched_tokens and need > max_num_batched_tokens:
        problems.append(
            f"the largest lookahead step is {need} tokens ({shape}) but --max-num-batched-tokens is "
            f"{max_num_batched_tokens}: raise it to >= {need} {shrink}"
        )
    if max_model_len and need + 1 > max_model_len:
        problems.append(
            f"the largest lookahead step is {need} tokens ({shape}) but --max-model-len {max_model_len} "
            f"leaves at most {max_model_len - 2} draft positions: raise it to >= {need + 1} {shrink}"
        )
    return problems


# vLLM 0.32 warns "max_num_scheduled_tokens is set to N based on the speculative decoding settings.
# This may lead to suboptimal performance ..." for every speculative config whose step budget is below
# this many tokens, whatever num_speculative_tokens is (vllm/config/vllm.py:
# VllmConfig._set_max_num_scheduled_tokens).
VLLM_SCHEDULED_TOKENS_WARNING_BELOW = 8192


def scheduled_tokens_note(cfg: LookaheadConfig, max_num_scheduled_tokens: int | None) -> str | None:
    """The line that follows vLLM's step-budget warning (see
    :data:`VLLM_SCHEDULED_TOKENS_WARNING_BELOW`) with why it appears and that it is expected;
    None where vLLM does not warn."""
    if max_num_scheduled_tokens is None or max_num_scheduled_tokens >= VLLM_SCHEDULED_TOKENS_WARNING_BELOW:
        return None
    return (
        f"vllm-lookahead: vLLM's warning \"max_num_scheduled_tokens is set to {max_num_scheduled_tokens} based on "
        f'the speculative decoding settings" is expected: vLLM gives it for every speculative method when '
        f"--max-num-batched-tokens is below {VLLM_SCHEDULED_TOKENS_WARNING_BELOW}, whatever num_speculative_tokens "
        f"is; lookahead's {cfg.max_draft_tokens} is the largest tree a step may carry, an upper bound its steps "
        "rarely reach"
    )


def check_engine_config(vllm_config: Any) -> None:
    """After vLLM built its config: raise :class:`LookaheadStartupError` listing every problem;
    else explain vLLM's step-budget warning if it gave one (:func:`scheduled_tokens_note`)."""
    if not is_lookahead_config(getattr(vllm_config, "speculative_config", None)):
        return
    cfg = LookaheadConfig.from_vllm_config(vllm_config)
    problems = engine_config_problems(vllm_config)
    scheduler, model = getattr(vllm_config, "scheduler_config", None), getattr(vllm_config, "model_config", None)
    problems += step_size_problems(
        cfg,
        getattr(scheduler, "max_num_batched_tokens", None),
        getattr(model, "max_model_len", None),
    )
    if problems:
        raise LookaheadStartupError("lookahead cannot run with this engine configuration: " + "; ".join(problems))
    note = scheduled_tokens_note(cfg, getattr(scheduler, "max_num_scheduled_tokens", None))
    if note is not None:
        logger.info("%s", note)
    for line in start_notes(vllm_config):
        logger.info("%s", line)
    if restore_draft_schedule(vllm_config, cfg):
        logger.info(
            'vllm-lookahead: vLLM\'s warning "Dynamic speculative decoding is not supported with data parallelism" '
            "does not apply to lookahead: its draft-length schedule gives every batch size the same %d draft "
            "tokens, so no two data-parallel ranks can differ; kept, so that the scheduler does not pad a request "
            "whose prompt is all in the prefix cache to %d placeholder rows",
            cfg.max_draft_tokens,
            1 + cfg.max_draft_tokens,
        )


def start_notes(vllm_config: Any) -> list[str]:
    """What vLLM's alarming start-up lines under lookahead mean, said once by the plugin: the
    experimental ``custom_class`` backend and async scheduling turned off (vLLM's two warnings for
    any custom proposer), and on CPU the two Triton lines that seem to contradict each other."""
    notes = [
        'vllm-lookahead: vLLM\'s warnings "Using a custom class-based proposer backend" and "Async '
        'scheduling not supported with custom_class-based speculative decoding" are expected: lookahead runs '
        "as vLLM's documented custom_class proposer, and its drafts are made on the host between two steps"
    ]
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    import importlib.util

    if device == "cpu" and importlib.util.find_spec("triton") is not None:
        notes.append(
            'vllm-lookahead: vLLM\'s lines "Triton is installed, but doesn\'t include CPU backend" and "Triton is '
            'not installed. triton-cpu is expected" say one thing: the triton package here (a dependency of '
            "vLLM's xgrammar) has no CPU backend, so the CPU engine runs without Triton, as it is built to"
        )
    return notes


def restore_draft_schedule(vllm_config: Any, cfg: LookaheadConfig) -> bool:
    """Put back the draft-length schedule of :func:`translate` where vLLM dropped it; whether it did.

    With ``data_parallel_size > 1`` vLLM drops every ``num_speculative_tokens_per_batch_size``
    (``VllmConfig._maybe_disable_dynamic_sd_for_data_parallel``: the ranks of a MoE model step
    together, and a schedule giving their different batch sizes different draft counts would part
    them).  Lookahead's one range gives every batch size the same K, as static speculation does; all
    that dropping it changes is the scheduler's padding of a new request whose prompt is all in the
    prefix cache to 1 + K placeholder rows on its first step (84 rows with the defaults, run for
    nothing).  Called on the finished config, before the engine cores are started with it.
    """
    spec = vllm_config.speculative_config
    parallel = getattr(vllm_config, "parallel_config", None)
    if (getattr(parallel, "data_parallel_size", 1) or 1) <= 1:
        return False
    if getattr(spec, "num_speculative_tokens_per_batch_size", ()) is not None:
        return False
    spec.num_speculative_tokens_per_batch_size = [(1, MAX_BATCH, cfg.max_draft_tokens)]
    return True
