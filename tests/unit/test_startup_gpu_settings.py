"""Start-up decisions for GPU settings, checked on the CPU with the config mocked (engine/hooks/startup.py).

FULL CUDA graphs would capture attention and skip the eager tree-attention pass on replay;
the plugin turns them into PIECEWISE graphs when it builds the engine config, and the
worker refuses a FULL mode that reaches it anyway.  Pipeline and decode-context
parallelism are refused at start-up; under data parallelism the draft-length schedule vLLM
drops is put back.  (Model Runner V2 is checked with vLLM's own decision in
tests/engine/test_startup.py.)
"""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.config.compilation import CUDAGraphMode  # noqa: E402

from vllm_lookahead.config import LookaheadConfig  # noqa: E402
from vllm_lookahead.engine.hooks import startup  # noqa: E402
from vllm_lookahead.engine.hooks.startup import LookaheadStartupError, tree_safe_cudagraph_mode  # noqa: E402


@pytest.mark.parametrize(
    "requested,expected",
    [
        (None, CUDAGraphMode.PIECEWISE),  # vLLM's GPU default (FULL_AND_PIECEWISE) would be FULL
        (CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.PIECEWISE),
        (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE),
        (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.PIECEWISE),
        ("full", CUDAGraphMode.PIECEWISE),
        (CUDAGraphMode.PIECEWISE, None),
        (CUDAGraphMode.NONE, None),
    ],
)
def test_full_cuda_graphs_become_piecewise_on_gpu_platforms(requested, expected):
    mode, message = tree_safe_cudagraph_mode(requested, static_graphs=True, enforce_eager=False)
    assert mode == expected
    assert (message is None) == (expected is None)
    if message:
        assert "PIECEWISE" in message and "tree attention" in message
    # no CUDA graphs on the platform (this CPU), or an eager model: nothing to change
    assert tree_safe_cudagraph_mode(requested, static_graphs=False, enforce_eager=False) == (None, None)
    assert tree_safe_cudagraph_mode(requested, static_graphs=True, enforce_eager=True) == (None, None)


def _engine_args(**overrides):
    args = SimpleNamespace(
        spec_method=None,
        speculative_config={"method": "lookahead", "window_size": 3},
        additional_config=None,
        compilation_config=SimpleNamespace(cudagraph_mode=None),
        enforce_eager=False,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_prepare_engine_args_translates_and_downgrades_once(monkeypatch, caplog):
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "support_static_graph_mode", classmethod(lambda cls: True))
    args = _engine_args(compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE))
    with caplog.at_level(logging.INFO, logger="vllm.lookahead"):
        cfg = startup.prepare_engine_args(args)
    assert cfg.window_size == 3
    assert (
        args.speculative_config["method"] == "custom_class" and args.additional_config["lookahead"]["window_size"] == 3
    )
    assert args.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "FULL_AND_PIECEWISE requested, using PIECEWISE" in warnings[0]

    other = _engine_args(
        speculative_config={"method": "ngram", "num_speculative_tokens": 2},
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL),
    )
    assert startup.prepare_engine_args(other) is None  # other methods: untouched
    assert other.compilation_config.cudagraph_mode == CUDAGraphMode.FULL


def test_spec_method_flag_is_accepted():
    args = _engine_args(spec_method="lookahead", speculative_config=None)
    assert startup.prepare_engine_args(args) is not None
    assert args.spec_method is None and args.speculative_config["method"] == "custom_class"


def _vllm_config(max_num_batched_tokens=2048, max_model_len=2048, spec=None, **parallel):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(model=startup.PROPOSER_PATH),
        additional_config={"lookahead": LookaheadConfig.from_user_dict(spec or {}).model_dump()},
        scheduler_config=SimpleNamespace(
            max_num_batched_tokens=max_num_batched_tokens, max_num_scheduled_tokens=max_num_batched_tokens
        ),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        use_v2_model_runner=False,
        attention_config=SimpleNamespace(hisparse_config=None),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, decode_context_parallel_size=1, **parallel),
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.PIECEWISE),
    )


def test_engine_configs_lookahead_cannot_serve_are_refused_naming_the_setting():
    ok = _vllm_config()
    startup.check_engine_config(ok)
    pp = _vllm_config()
    pp.parallel_config.pipeline_parallel_size = 2
    dcp = _vllm_config()
    dcp.parallel_config.decode_context_parallel_size = 2
    full = _vllm_config()
    full.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    for config, needle in (
        (pp, "--pipeline-parallel-size 2"),
        (dcp, "--decode-context-parallel-size 2"),
        (full, "cudagraph_mode FULL_DECODE_ONLY"),
    ):
        with pytest.raises(LookaheadStartupError, match=needle) as err:
            startup.check_engine_config(config)
        assert "\n" not in str(err.value)
    not_lookahead = _vllm_config()
    not_lookahead.speculative_config = None
    not_lookahead.parallel_config.pipeline_parallel_size = 2
    startup.check_engine_config(not_lookahead)  # engines without lookahead are not ours to judge


def test_the_worker_refuses_full_cuda_graphs_that_reach_it():
    """A VllmConfig built without the plugin's EngineArgs hook still cannot run FULL graphs."""
    from vllm_lookahead.engine.step.kv_layers import paged_kv_of

    runner = SimpleNamespace(
        kv_cache_config=SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=[])]),
        attn_groups=[[SimpleNamespace(backend=SimpleNamespace(get_name=lambda: "FLASH_ATTN"))]],
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE),
    )
    with pytest.raises(NotImplementedError, match="FULL_AND_PIECEWISE.*PIECEWISE"):
        paged_kv_of(runner)  # RunnerLookahead.setup_kv's check


def test_configs_whose_largest_step_cannot_fit_the_engine_are_refused():
    """1 + max_draft_tokens must fit max_num_batched_tokens, and max_model_len must leave room
    for the largest tree after a one-token prompt; the line says which limit and what to set."""
    spec = {"window_size": 4, "ngram_size": 4, "guess_set_size": 4, "max_lead_tokens": 8}
    need = 1 + LookaheadConfig.from_user_dict(spec).max_draft_tokens
    startup.check_engine_config(_vllm_config(max_num_batched_tokens=need, max_model_len=need + 1, spec=spec))
    for settings, needle in (
        (dict(max_num_batched_tokens=need - 1), f"--max-num-batched-tokens is {need - 1}: raise it to >= {need}"),
        (
            dict(max_model_len=need),
            f"--max-model-len {need} leaves at most {need - 2} draft positions: raise it to >= {need + 1}",
        ),
    ):
        with pytest.raises(LookaheadStartupError, match=re.escape(needle)) as err:
            startup.check_engine_config(_vllm_config(spec=spec, **settings))
        assert "\n" not in str(err.value) and "window_size 4" in str(err.value)
    with pytest.raises(LookaheadStartupError) as err:  # both at once: both named, one line
        startup.check_engine_config(_vllm_config(max_num_batched_tokens=16, max_model_len=16))
    assert "--max-num-batched-tokens" in str(err.value) and "--max-model-len" in str(err.value)


def test_vllms_step_budget_warning_is_explained_where_vllm_gives_it(caplog):
    """vLLM warns that max_num_scheduled_tokens "is set to 2048 based on the speculative decoding
    settings" for any speculative method below 8192 tokens: one line after it says so."""
    with caplog.at_level(logging.INFO, logger="vllm.lookahead"):
        startup.check_engine_config(_vllm_config(max_num_batched_tokens=2048))
        startup.check_engine_config(_vllm_config(max_num_batched_tokens=8192))
    (note,) = [r.getMessage() for r in caplog.records if "max_num_scheduled_tokens" in r.getMessage()]
    assert note.startswith("vllm-lookahead: vLLM's warning \"max_num_scheduled_tokens is set to 2048 based on")
    assert "every speculative method" in note and f"lookahead's {LookaheadConfig().max_draft_tokens} " in note


def test_vllms_custom_class_and_triton_lines_are_explained_once(caplog, monkeypatch):
    """vLLM warns that custom_class proposers are experimental and turns async scheduling off; on
    CPU with the triton package present it says both that Triton is installed without a CPU
    backend and that it is not installed: the plugin says once what each means."""
    import importlib.util

    with caplog.at_level(logging.INFO, logger="vllm.lookahead"):
        startup.check_engine_config(_vllm_config(max_num_batched_tokens=8192))
    notes = [r.getMessage() for r in caplog.records]
    assert len([n for n in notes if "custom class-based proposer backend" in n and "Async scheduling" in n]) == 1
    cpu = _vllm_config(max_num_batched_tokens=8192)
    cpu.device_config = SimpleNamespace(device_type="cpu")
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else find(name, *a))
    assert any("Triton is not installed. triton-cpu is expected" in n for n in startup.start_notes(cpu))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find(name, *a))
    assert not any("Triton" in n for n in startup.start_notes(cpu))


def test_the_draft_length_schedule_vllm_drops_under_data_parallelism_is_put_back(caplog):
    """With data_parallel_size > 1 vLLM sets num_speculative_tokens_per_batch_size to None (its
    scheduler would then pad fully cached prompts to 1 + K placeholder rows); lookahead's one-range
    schedule gives every batch size the same K, so the check puts it back and says why, once."""
    k = LookaheadConfig().max_draft_tokens
    dropped = _vllm_config(data_parallel_size=2)
    dropped.speculative_config.num_speculative_tokens_per_batch_size = None
    with caplog.at_level(logging.INFO, logger="vllm.lookahead"):
        startup.check_engine_config(dropped)
    assert dropped.speculative_config.num_speculative_tokens_per_batch_size == [(1, startup.MAX_BATCH, k)]
    notes = [r.getMessage() for r in caplog.records if "data parallelism" in r.getMessage()]
    assert len(notes) == 1 and f"the same {k} draft tokens" in notes[0] and f"{k + 1} placeholder rows" in notes[0]

    caplog.clear()
    for dp, schedule in ((1, None), (2, [(1, 8, 3)])):  # one engine: nothing dropped; a schedule present: kept
        config = _vllm_config(data_parallel_size=dp)
        config.speculative_config.num_speculative_tokens_per_batch_size = schedule
        with caplog.at_level(logging.INFO, logger="vllm.lookahead"):
            startup.check_engine_config(config)
        assert config.speculative_config.num_speculative_tokens_per_batch_size == schedule
    assert not [r for r in caplog.records if "data parallelism" in r.getMessage()]
