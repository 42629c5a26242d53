"""The GPU projection's cost model: calibrated against the Medusa paper's A100 7B curve, labelled."""

from __future__ import annotations

import pytest
from test_bench import _raw

from benchmarks.projection import A100, H100, LLAMA_7B, forward_seconds, knee_tokens, projected_speedup


def _ratio(gpu, tokens):
    return forward_seconds(gpu, LLAMA_7B, tokens) / forward_seconds(gpu, LLAMA_7B, 1)


def test_a100_curve_matches_the_published_shape():
    # Medusa (arXiv:2401.10774), simulated A100 7B: flat up to 64 tokens, ~1.1x at 80-96, ~1.2x at 112
    assert _ratio(A100, 64) == pytest.approx(1.0)
    assert 1.05 <= _ratio(A100, 112) <= 1.25
    assert 80 <= knee_tokens(A100, LLAMA_7B) <= 120
    assert knee_tokens(H100, LLAMA_7B) > knee_tokens(A100, LLAMA_7B)  # more FLOPs per byte


def test_chains_below_the_knee_project_their_mat_and_trees_pay_the_eager_pass():
    assert projected_speedup(A100, LLAMA_7B, 2.5, 10, branching=False) == pytest.approx(2.5)
    with_pass = projected_speedup(A100, LLAMA_7B, 2.5, 40, branching=True)
    without = projected_speedup(A100, LLAMA_7B, 2.5, 40, branching=True, tree_pass=False)
    assert without == pytest.approx(2.5) and with_pass < without
    # past the knee the forward grows with its tokens
    assert projected_speedup(A100, LLAMA_7B, 2.5, 300, branching=False) < 2.5


def _results_with_trees(tmp_path):
    """The bench fixture's results.json, its lookahead method drafting trees (a fixed budget)."""
    import json

    raw = _raw()
    raw["methods"][2]["speculative_config"] = {"method": "lookahead", "max_tokens_per_step": 0}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw))
    return path


def test_project_labels_itself_and_lists_only_speculative_batch1_rows(tmp_path):
    from benchmarks.projection import project

    md = project(_results_with_trees(tmp_path))
    assert md.startswith("Projection, not a measurement")
    rows = [line for line in md.splitlines() if line.startswith("| lookahead")]
    assert len(rows) == 1 and "| code | 2.00 | 10.0 | yes |" in rows[0]
    assert "no-spec" not in md


def _cost_file(tmp_path, name, **extra):
    import json

    path = tmp_path / name
    # 10 ms flat up to 8 tokens, then +1 ms per token; 0.5 ms per tree row.
    path.write_text(
        json.dumps(
            {
                "tokens": [1, 8, 16],
                "seconds": [0.010, 0.010, 0.018],
                "tree_row_seconds": 0.0005,
                "tree_step_seconds": 0.0,
                **extra,
            }
        )
    )
    return path


def test_measured_costs_price_the_same_rows_and_say_where_they_were_measured(tmp_path):
    from benchmarks.projection import project_measured

    results = _results_with_trees(tmp_path)
    b1 = _cost_file(tmp_path, "cost_b1.json", gpu="NVIDIA H100 80GB HBM3", batch=1, model="8B shape")
    plain = _cost_file(tmp_path, "plain.json")
    md = project_measured(results, [b1, plain])
    assert md.startswith(
        "Measured forward cost on NVIDIA H100 80GB HBM3, plain (8B shape; model not named), "
        "acceptance measured on the 135M model on CPU"
    )
    assert "| NVIDIA H100 80GB HBM3, batch 1 | plain |" in md
    # MAT 2, 10 drafts per step -> 11 tokens: 10 + 3 ms, plus 10 tree rows x 0.5 ms = 18 ms vs 10 ms.
    row = next(line for line in md.splitlines() if line.startswith("| lookahead"))
    assert row.endswith(f"| {2 * 10 / 18:.2f}x | {2 * 10 / 18:.2f}x |")


def test_bench_project_cost_option_uses_the_files(tmp_path, capsys):
    import argparse

    from benchmarks import cli

    results = _results_with_trees(tmp_path)
    cost = _cost_file(tmp_path, "cost_b4.json", gpu="GPU X", batch=4)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--project", str(results), "--project-cost", str(cost)])) == 0
    assert capsys.readouterr().out.startswith("Measured forward cost on GPU X")
    assert cli.run(parser.parse_args(["--project", str(results)])) == 0
    assert capsys.readouterr().out.startswith("Projection, not a measurement")
