"""Which lookahead state a worker process runs (engine/hooks/step_context.py), and the hooks that read
the step's trees through it without a model runner: the grammar-bitmask hook and the counters."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from types import SimpleNamespace

import pytest

from vllm_lookahead.engine.hooks import step_context
from vllm_lookahead.engine.hooks.step_context import STEP_CONTEXT, StepContext
from vllm_lookahead.engine.metrics import stats


@pytest.fixture(autouse=True)
def keep_this_process_state():
    before = STEP_CONTEXT.owner
    yield
    if before is None:
        STEP_CONTEXT.clear()
    else:
        STEP_CONTEXT.register(before)


def test_readers_see_the_registered_states_batch_and_counters():
    context = StepContext()
    assert context.owner is None and context.tree_batch() is None and context.stats() is None
    state = SimpleNamespace(batch=None, stats=stats.LookaheadStats())
    context.register(state)
    assert context.tree_batch() is None  # between steps
    state.batch = "trees"
    assert context.tree_batch() == "trees" and context.stats() is state.stats
    newer = SimpleNamespace(batch=None, stats=stats.LookaheadStats())
    context.register(newer)  # a newer engine in the same process
    assert context.owner is newer and context.tree_batch() is None
    context.clear()
    assert context.owner is None


def test_live_stats_are_the_registered_states():
    STEP_CONTEXT.clear()
    assert step_context.live_stats() is None and step_context.rank_drafts() == {}
    state = SimpleNamespace(batch=None, stats=stats.LookaheadStats(drafts_proposed=2))
    STEP_CONTEXT.register(state)
    assert step_context.live_stats() is state.stats and step_context.rank_drafts()["drafts"] == 2


def test_the_runner_state_registers_itself_when_created():
    pytest.importorskip("vllm")
    from vllm_lookahead.engine.hooks.proposer import LookaheadProposer
    from vllm_lookahead.engine.runner import RunnerLookahead

    STEP_CONTEXT.clear()
    model = SimpleNamespace(max_model_len=4096, uses_mrope=False)
    vllm_config = SimpleNamespace(
        additional_config={"lookahead": {}}, model_config=model, device_config=SimpleNamespace(device_type="cpu")
    )
    runner = SimpleNamespace(
        vllm_config=vllm_config,
        model_config=model,
        drafter=LookaheadProposer(vllm_config),
        input_batch=SimpleNamespace(req_ids=[]),
        requests={},
    )
    state = RunnerLookahead.of(runner)
    assert STEP_CONTEXT.owner is state and RunnerLookahead.of(runner) is state
    assert runner.drafter.owner is state  # the proposer forwards to it
    plain = SimpleNamespace(drafter=None)
    assert RunnerLookahead.of(plain) is None and STEP_CONTEXT.owner is state  # an engine without lookahead


@dataclasses.dataclass
class _SchedulerOutput:
    scheduled_spec_decode_tokens: dict


def test_the_grammar_hook_reads_the_steps_trees():
    pytest.importorskip("vllm")
    from vllm_lookahead.engine.hooks import patches

    seen = []
    hook = patches._apply_grammar_bitmask(
        lambda out, grammar, batch, logits: seen.append(out.scheduled_spec_decode_tokens)
    )
    spec = {"a": [1, 2, 3, 4]}
    STEP_CONTEXT.clear()
    hook(_SchedulerOutput(spec), None, None, None)  # no lookahead state: vLLM's rows as they are
    trees = SimpleNamespace(logits_rows_as_drafts=lambda s: {r: t[:1] for r, t in s.items()})
    state = SimpleNamespace(batch=trees, stats=stats.LookaheadStats())
    STEP_CONTEXT.register(state)
    hook(_SchedulerOutput(spec), None, None, None)  # a tree step: the tree's own logits rows
    state.batch = None
    hook(_SchedulerOutput(spec), None, None, None)  # after _sample took the batch
    assert seen == [spec, {"a": [1]}, spec]


def test_the_readers_do_not_import_the_runner():
    """No import circle: the runner imports its readers' modules, never the other way."""
    code = (
        "import sys, vllm_lookahead.engine.metrics.stats, vllm_lookahead.engine.hooks.proposer, "
        "vllm_lookahead.engine.hooks.step_context; print('vllm_lookahead.engine.runner' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    assert out.stdout.strip() == "False"
