"""The GPU check (``python -m benchmarks.gpu.check``) as its CPU smoke run.

The run goes in a subprocess where ``pydantic`` and ``vllm`` cannot be imported -- the GPU machine
has neither -- and without ``TRITON_INTERPRET`` set: the command itself must choose Triton's
interpreter before its kernels are defined.  (The part modules define the kernels, so this test
process never imports them: that would fix their mode for every later test.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.gpu.fixtures import add_window, branching_tree, lookahead_tree
from vllm_lookahead.core.step_cost import StepCost
from vllm_lookahead.core.tree import TreeBuilder
from vllm_lookahead.core.window import JacobiWindow

BLOCK_IMPORTS = "import sys; sys.modules['pydantic'] = None; sys.modules['vllm'] = None; "
RUN = "import runpy; runpy.run_module('benchmarks.gpu.check', run_name='__main__', alter_sys=True)"


def _run(out: Path, *args: str, prelude: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    argv = ["benchmarks.gpu.check", "--out", str(out), "--cpu-smoke", *args]
    code = BLOCK_IMPORTS + f"sys.argv = {argv!r}; " + prelude + RUN
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The whole smoke run, every case: its parts' time budget (made for a GPU's sweeps) set past
    what Triton's interpreter takes on a loaded 2-core machine, where 300 s skipped cases."""
    out = tmp_path_factory.mktemp("gpu-check")
    return _run(out, "--budget-s", "3000"), out


def test_cpu_smoke_runs_every_part_without_vllm_or_pydantic(smoke):
    proc, out = smoke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    raw = json.loads((out / "gpu_check.json").read_text())
    env = raw["environment"]
    assert env["device"] == "cpu" and "meaningless" in env["timings"]
    assert {"gpu", "torch", "triton", "cuda", "date_utc", "command"} <= set(env)
    assert list(raw["parts"]) == ["exactness", "layer", "compaction", "forward", "sampling", "batches"]
    for name, part in raw["parts"].items():
        assert part["status"] == "complete" and not part["errors"], (name, part["errors"], part["skipped"])
    exact = raw["parts"]["exactness"]["tables"]
    assert raw["failures"] == [] and all(r["passed"] for r in exact["attention"] + exact["compaction"])
    assert {r["rows"] for r in exact["attention"]} == {"branch", "all", "causal"}
    assert any(r["num_splits_run"] > 1 for r in exact["attention"])
    layer = raw["parts"]["layer"]["tables"]["layer"]
    assert all(
        {"kernel_s", "causal_s", "sdpa_s", "torch_s", "kernel_over_causal", "masked_over_kernel"} <= set(r)
        for r in layer
    )
    assert {r["mode"] for r in raw["parts"]["forward"]["tables"]["forward"]} == {"chain", "tree", "tree_one_pass"}
    sampling = raw["parts"]["sampling"]["tables"]
    assert all(
        r["row_draws_equal_fresh_draws"]
        and r["state_set_back_redraws"]
        and r["ahead_tokens_equal_walk"]
        and r["batched_walk_equals_walks"]
        for r in sampling["exactness"]
    )
    assert {r["case"] for r in sampling["cost"]} >= {
        "vllm_b1",
        "walk_k2",
        "ahead_n8_d4",
        "walks_seeded_r8_d2",
        "walks_ahead_r8_d2",
    }
    assert {(r["batch"], r["tokens"]) for r in raw["parts"]["batches"]["tables"]["forward"]} == {(3, 1), (3, 4)}
    md = (out / "gpu_check.md").read_text()
    assert "**Exactness: every case run passed**" in md and "| T per request |" in md and "| kernel/causal |" in md
    assert "[" in proc.stdout and "written to" in proc.stdout  # progress lines


def test_cpu_smoke_writes_step_cost_files_replay_can_read(smoke):
    from benchmarks.replay import replay_cost

    _, out = smoke
    for batch in (1, 2):
        path = out / f"cost_b{batch}.json"
        raw = json.loads(path.read_text())
        cost = StepCost.from_dict(raw)
        assert cost.tokens == (1, 2, 4, 8) and raw["batch"] == batch and raw["gpu"].startswith("none")
        assert raw["tree_row_seconds"] == pytest.approx(max(0.0, raw["tree_extra_seconds"] / raw["tree_rows_measured"]))
        assert replay_cost(str(path)).tokens == cost.tokens


def test_a_failing_exactness_case_makes_the_command_fail(tmp_path):
    # Negative tolerances: every attention case fails (compaction is bit-exact regardless).
    prelude = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'; "
        "from benchmarks.gpu import exactness as g; "
        "g.TOLERANCE.update(dict.fromkeys(g.TOLERANCE, -1.0)); "
    )
    proc = _run(tmp_path, "--parts", "exactness", prelude=prelude)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    raw = json.loads((tmp_path / "gpu_check.json").read_text())
    assert raw["failures"] and list(raw["parts"]) == ["exactness"]
    assert "FAILED" in (tmp_path / "gpu_check.md").read_text()


def test_trees_have_the_shapes_they_are_named_for():
    for rows in (1, 3, 4, 7, 8, 16, 32, 64):
        tree = branching_tree(rows)
        tree.validate()
        assert tree.size == rows + 1
        assert (tree.first_branch_node < tree.size) == (rows > 1)
    full = lookahead_tree(3, 3, 5, 3)
    assert full.size == 1 + 9 + 5 * 3 - 1


def test_the_window_is_laid_out_as_the_jacobi_window_lays_it_out():
    window = JacobiWindow(5, 4, [1, 2, 3], np.random.default_rng(0))
    window.levels = [np.arange(5), np.arange(5), np.arange(5)]  # three filled levels
    ours, theirs = TreeBuilder(0), TreeBuilder(0)
    add_window(ours, 5, 3)
    window.add_to_tree(theirs, root=0)
    a, b = ours.build(), theirs.build()
    assert np.array_equal(a.parents, b.parents) and np.array_equal(a.logits, b.logits)
