"""The GPU projection's cost model: calibrated against the Medusa paper's A100 7B curve, labelled."""

from __future__ import annotations

import pytest

from vllm_lookahead.bench.projection import A100, H100, LLAMA_7B, forward_seconds, knee_tokens, projected_speedup

from test_bench import _raw


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


def test_project_labels_itself_and_lists_only_speculative_batch1_rows(tmp_path):
    import json

    from vllm_lookahead.bench.projection import project

    raw = _raw()
    raw["methods"][2]["speculative_config"] = {"method": "lookahead", "max_tokens_per_step": 0}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw))
    md = project(path)
    assert md.startswith("Projection, not a measurement")
    rows = [line for line in md.splitlines() if line.startswith("| lookahead")]
    assert len(rows) == 1 and "| code | 2.00 | 10.0 | yes |" in rows[0]
    assert "no-spec" not in md
