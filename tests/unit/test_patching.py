"""The patch mechanism (engine/hooks/patching.py) and the patch table (engine/hooks/patches.py).

Mechanism tests patch functions of this module; ``_vllm_root`` is pointed at this
test folder so they count as "vLLM's own", and a function compiled under another
file name plays another plugin's replacement.  Table tests resolve every entry
against the vLLM actually installed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import pickle
from pathlib import Path

import pytest

from vllm_lookahead.engine.hooks import patching
from vllm_lookahead.engine.hooks.patching import AddedField, Patch, PatchError, PatchSet

HERE = Path(__file__).resolve().parent


class Runner:
    def step(self, batch, budget):
        return ("step", batch, budget)


def helper(x):
    return x + 1


def _wrap(tag):
    def make(original):
        def replacement(*args, **kwargs):
            return (tag, original(*args, **kwargs))

        return replacement

    return make


@pytest.fixture(autouse=True)
def this_folder_is_vllm(monkeypatch):
    monkeypatch.setattr(patching, "_vllm_root", lambda: str(HERE) + "/")
    original_step, original_helper = Runner.__dict__["step"], helper
    yield
    Runner.step = original_step
    globals()["helper"] = original_helper


STEP = Patch(f"{__name__}:Runner.step", ("self", "batch", "budget"), "why the step changes; details", _wrap("la"))


def test_apply_keeps_the_original_logs_once_and_is_idempotent(caplog):
    original = Runner.__dict__["step"]
    with caplog.at_level(logging.DEBUG, logger="vllm.lookahead"):
        applied = patching.apply(STEP)
        again = patching.apply(STEP)
    assert again is applied
    assert Runner().step(1, 2) == ("la", ("step", 1, 2))  # wrapped once, not twice
    assert Runner.step.__wrapped__ is original and applied.original is original
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, f"vllm-lookahead: patched {STEP.target}: why the step changes")
    ]


def test_a_patch_set_logs_one_line_for_what_it_installed(caplog):
    """vLLM loads the plugin in every process it starts: one INFO line per process, the list at DEBUG."""
    both = [STEP, Patch(f"{__name__}:helper", ("x",), "r", _wrap("h"))]
    with caplog.at_level(logging.INFO, logger="vllm.lookahead"):
        patches = PatchSet().apply(both)
        PatchSet().apply(both)  # installed already: nothing to say
        patches.undo()
        PatchSet().apply([STEP]).undo()
    assert [r.getMessage() for r in caplog.records] == [
        "vllm-lookahead: patched 2 vLLM symbols (lookahead); VLLM_LOGGING_LEVEL=DEBUG logs each with its reason "
        "(the plugin's table: python -m vllm_lookahead.engine.hooks.patches)",
        f"vllm-lookahead: patched {STEP.target}: why the step changes",
    ]


def test_module_function_patch_and_undo():
    import sys

    patches = PatchSet().apply([Patch(f"{__name__}:helper", ("x",), "r", _wrap("h"))])
    assert sys.modules[__name__].helper(1) == ("h", 2)
    patches.undo()
    assert sys.modules[__name__].helper(1) == 2


def test_a_changed_signature_is_refused_naming_the_symbol():
    bad = Patch(f"{__name__}:Runner.step", ("self", "scheduler_output"), "r", _wrap("la"))
    with pytest.raises(
        PatchError, match=r"Runner\.step takes \(self, batch, budget\).*written for \(self, scheduler_output\)"
    ):
        patching.apply(bad)
    assert "step" in Runner.__dict__ and not hasattr(Runner.step, patching.MARK)


def test_a_missing_symbol_is_refused():
    with pytest.raises(PatchError, match="does not exist in the installed vLLM"):
        patching.apply(Patch(f"{__name__}:Runner.gone", ("self",), "r", _wrap("la")))


def test_another_plugins_replacement_is_refused():
    original = Runner.__dict__["step"]
    namespace: dict = {"functools": functools, "original": original}
    # functools.wraps copies name, module and __wrapped__ -- the code still lives elsewhere
    exec(
        compile(
            "@functools.wraps(original)\ndef step(self, batch, budget):\n    return original(self, batch, budget)\n",
            "/opt/other_plugin/patches.py",
            "exec",
        ),
        namespace,
    )
    Runner.step = namespace["step"]
    with pytest.raises(
        PatchError, match=r"already been replaced by another plugin .*/opt/other_plugin/patches.py.*VLLM_PLUGINS"
    ):
        patching.apply(STEP)


def test_library_decorators_vllm_applies_are_not_another_plugin():
    import torch

    @torch.inference_mode()
    def decorated(x):
        return x

    assert patching.defined_by_vllm(decorated)  # torch's wrapper, around code "of vLLM" (this folder)
    foreign: dict = {}
    exec(compile("def f(x):\n    return x\n", "/opt/other_plugin/patches.py", "exec"), foreign)
    assert not patching.defined_by_vllm(torch.inference_mode()(foreign["f"]))


def test_timers_stack_on_lookahead_and_undo_in_order():
    lookahead = PatchSet().apply([STEP])
    timer = Patch(STEP.target, STEP.params, "timer", _wrap("timer"), tag="bench-timer")
    timers = PatchSet().apply([timer])
    assert Runner().step(1, 2) == ("timer", ("la", ("step", 1, 2)))
    with pytest.raises(PatchError, match="patched over it"):
        lookahead.undo()  # the timer sits on top: undoing below it would drop it silently
    timers.undo()
    assert Runner().step(1, 2) == ("la", ("step", 1, 2))
    lookahead.applied = [patching.applied_record(Runner.__dict__["step"])]
    lookahead.undo()
    assert Runner().step(1, 2) == ("step", 1, 2)


@dataclasses.dataclass
class Stats:
    steps: int = 0


NOTE = AddedField(f"{__name__}:Stats.note", "dict | None", "why a field; details")


def test_an_added_field_is_declared_carried_and_undone(caplog):
    with caplog.at_level(logging.DEBUG, logger="vllm.lookahead"):
        fields = PatchSet().apply([NOTE])
        PatchSet().apply([NOTE])  # declared already: nothing to say
    try:
        assert [f.name for f in dataclasses.fields(Stats)] == ["steps", "note"]
        stats = Stats(steps=3)  # vLLM's __init__ is unchanged: the default until set
        assert stats.note is None
        stats.note = {"a": 1}
        assert pickle.loads(pickle.dumps(stats)).note == {"a": 1}
    finally:
        fields.undo()
    assert [f.name for f in dataclasses.fields(Stats)] == ["steps"]
    assert "note" not in vars(Stats) and "note" not in Stats.__annotations__
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG] == [
        f"vllm-lookahead: declared {NOTE.target}: why a field"
    ]


def test_an_added_field_is_refused_where_it_cannot_be_declared_safely(monkeypatch):
    with pytest.raises(PatchError, match=r"Stats\.steps is already declared"):
        PatchSet().apply([AddedField(f"{__name__}:Stats.steps", "int", "r")])  # vLLM's own field
    with pytest.raises(PatchError, match="is not a dataclass"):
        PatchSet().apply([AddedField(f"{__name__}:Runner.note", "int", "r")])
    with pytest.raises(PatchError, match="has no Missing"):
        PatchSet().apply([AddedField(f"{__name__}:Missing.note", "int", "r")])
    monkeypatch.setattr(patching, "_vllm_root", lambda: "/opt/vllm/")
    with pytest.raises(PatchError, match="is not vLLM's class"):
        PatchSet().apply([NOTE])
    assert [f.name for f in dataclasses.fields(Stats)] == ["steps"]


# -- the table against the installed vLLM ---------------------------------------------

vllm = pytest.importorskip("vllm")


@pytest.fixture
def real_vllm_root(monkeypatch):
    monkeypatch.undo()  # the autouse fixture pointed the root here


def test_every_table_entry_matches_the_installed_vllm(real_vllm_root):
    from vllm_lookahead.engine.hooks.patches import ATTENTION_PATCHES, PATCHES

    checked = []
    for patch in (*PATCHES, *ATTENTION_PATCHES.values()):
        try:
            owner, name = patching.resolve(patch)
        except PatchError as exc:
            if "flashinfer" in patch.target and "cannot import" in str(exc):
                continue  # the flashinfer package is GPU-only; its signature was read from vllm 0.32/0.33 source
            raise
        current = vars(owner)[name]
        assert patching.defined_by_vllm(patching.vllm_original(current)), patch.target
        patching.check_signature(patch, current)
        checked.append(patch.target)
    assert len(checked) >= len(PATCHES) + 3
    # the benchmark's step timers are patches too (execute_model is under @torch.inference_mode())
    from benchmarks.driver import RUNNER, TIMED_METHODS

    for key, (name, params) in TIMED_METHODS.items():
        timer = Patch(f"{RUNNER}.{name}", params, key, _wrap(key), tag="bench-timer")
        owner, attr = patching.resolve(timer)
        assert patching.defined_by_vllm(patching.vllm_original(vars(owner)[attr])), timer.target
        patching.check_signature(timer, vars(owner)[attr])
    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    for patch in (*PATCHES, *ATTENTION_PATCHES.values()):
        assert patch.owner_path[1] in design, f"docs/design.md does not list {patch.target}"


def test_the_fields_are_declared_on_vllms_classes(real_vllm_root):
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    from vllm_lookahead.engine.hooks.patches import FIELDS, INSTALLED

    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    for added in FIELDS:
        assert added.target in design, f"docs/design.md does not list {added.target}"
    INSTALLED.apply(FIELDS)  # as the plugin does in every process (idempotent)
    classes = {"SchedulerStats": SchedulerStats, "ModelRunnerOutput": ModelRunnerOutput}
    for added in FIELDS:
        owner, name = added.owner_path[1].split(".")
        assert name in {f.name for f in dataclasses.fields(classes[owner])}
    assert EMPTY_MODEL_RUNNER_OUTPUT.lookahead_report is None
    output = ModelRunnerOutput(req_ids=["a"], req_id_to_index={"a": 0})
    output.lookahead_report = {"trees": {}}
    assert pickle.loads(pickle.dumps(output)).lookahead_report == {"trees": {}}  # worker -> scheduler process


def test_a_runner_subclass_overriding_a_patched_method_is_refused(real_vllm_root):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_lookahead.engine.hooks import patches

    patches.install()  # idempotent; inert for engines without lookahead
    patches.check_runner_class(GPUModelRunner)
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    patches.check_runner_class(CPUModelRunner)  # what runs on this machine

    class Overriding(GPUModelRunner):
        def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
            return None

    with pytest.raises(RuntimeError, match="overrides _prepare_inputs"):
        patches.check_runner_class(Overriding)


def test_discarded_rows_cpu_generators_are_hidden_for_the_step_and_put_back():
    """engine/hooks/seeded_prefill.py: the generator of a row whose sample vLLM discards is out of the
    table while vLLM samples (so nothing is drawn from it and vLLM's CUDA-only rewind cannot run)."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from vllm_lookahead.engine.hooks import seeded_prefill

    gens = {
        0: torch.Generator().manual_seed(1),
        2: torch.Generator().manual_seed(2),
        3: torch.Generator().manual_seed(3),
    }
    state = {i: g.get_state().clone() for i, g in gens.items()}
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(generators=dict(gens), num_reqs=4),
        discard_request_mask=SimpleNamespace(np=np.array([True, True, False, True, True])),
    )
    hidden = seeded_prefill.hide_discarded_generators(runner)
    assert set(hidden) == {0, 3} and set(runner.input_batch.generators) == {2}  # row 4 is past num_reqs
    seeded_prefill.restore_generators(runner, hidden)
    assert runner.input_batch.generators == gens
    assert all(torch.equal(g.get_state(), state[i]) for i, g in gens.items())
    empty = SimpleNamespace(
        input_batch=SimpleNamespace(generators={}, num_reqs=1),
        discard_request_mask=SimpleNamespace(np=np.array([True])),
    )
    assert seeded_prefill.hide_discarded_generators(empty) == {}
