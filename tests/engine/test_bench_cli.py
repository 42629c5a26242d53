"""`python -m benchmarks` end to end on the toy model (small, but every stage real).

The benchmark runs in a subprocess: the harness keeps its engines in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which must not leak into this test session.  Its replays
start no engine and run here.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # python -m benchmarks runs from the checkout

pytestmark = pytest.mark.engine

# Lookahead as one chain per request within a fixed cap: what replay reproduces exactly.
LOOKAHEAD = '{"window_size": 0, "ngram_size": 3, "guess_set_size": 1, "max_tokens_per_step": 24}'
LOOKAHEAD = "lookahead:" + LOOKAHEAD
LABEL = "lookahead W0 N3 G1 max_tokens_per_step=24"


def _replay(capsys, *argv: str) -> str:
    """``python -m benchmarks ARGV`` for a replay (no engine), in this process: its stdout."""
    from benchmarks.cli import main

    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_bench_runs_every_method_side_by_side(toy_model, tmp_path, capsys):
    out = tmp_path / "bench"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        "--model",
        toy_model,
        "--methods",
        "none",
        "ngram",
        LOOKAHEAD,
        "--categories",
        "code",
        "--prompts-per-category",
        "3",
        "--concurrency",
        "1",
        "4",
        "--min-sweep-requests",
        "4",
        "--requests-per-slot",
        "1",
        "--max-tokens",
        "24",
        "--sweep-max-tokens",
        "16",
        "--repeats",
        "1",
        "--max-model-len",
        "512",
        "--max-prompt-tokens",
        "400",
        "--ignore-eos",
        "--out",
        str(out),
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run(cwd=ROOT, args=cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "## Batch 1, per prompt category" in proc.stdout
    assert "%|" in proc.stderr  # the progress bar
    md = (out / "results.md").read_text()
    assert "; engines: glibc malloc, MALLOC_MMAP_THRESHOLD_=" in md or "; engines: as given: " in md

    raw = json.loads((out / "results.json").read_text())
    assert [m["method"] for m in raw["methods"]] == [
        "no-spec",
        "ngram k=4 lookup 2..4",
        LABEL,
    ]
    ref_runs = raw["methods"][0]["runs"]
    # --ignore-eos: every request generates max_tokens (--sweep-max-tokens for the sweep)
    assert {len(o) for m in raw["methods"] for r in m["runs"]["code"] for o in r["outputs"]} == {24}
    assert {len(o) for m in raw["methods"] for r in m["runs"]["sharegpt@c4"] for o in r["outputs"]} == {16}
    rows = list(csv.DictReader((out / "results.csv").open()))
    by = {(r["method"], r["workload"]): r for r in rows}
    assert set(w for _, w in by) == {"code", "sharegpt@c1", "sharegpt@c4"}
    for (method, workload), r in by.items():
        # greedy speculation is exact on the toy model: every completion matches no-spec
        assert r["exact"] == r["compared"] and int(r["compared"]) > 0, (method, workload)
        assert float(r["tok_s"]) > 0 and float(r["ttft_ms"]) > 0
    la = by[(LABEL, "code")]
    # the toy model loops, so the pool verifies drafts (on CPU "auto" drafts one chain per
    # request, N-1 = 2 tokens at first, growing while accepted in full)
    assert float(la["MAT"]) > 1.1 and float(la["draft_per_step"]) >= 2.0
    assert float(la["propose_ms"]) > 0
    assert float(by[("no-spec", "code")]["MAT"]) == 1.0
    for png in ("speedup_vs_concurrency.png", "mat_per_category.png"):
        assert (out / png).stat().st_size > 1000
    # one round, every method in its own engine (rounds and their order: tests/unit/test_bench.py)
    logs = sorted(p.name for p in (out / "logs").glob("*.log"))
    assert [name[:4] for name in logs] == ["r0-0", "r0-1", "r0-2"]
    md = (out / "results.md").read_text()
    assert "## Where a step's time goes" in md and "forward @ 1" in md
    assert "ignore_eos: every request generates max_tokens" in md
    # lookahead's own counters (read in-process from its runner): every accepted token has a source
    for run in raw["methods"][2]["runs"]["code"]:
        c = run["counters"]
        assert c["lookahead_steps"] > 0 and c["lookahead_accepted_tokens"] > 0
        by_source = sum(c[f"lookahead_accepted_{s}"] for s in ("prompt", "output", "shared", "window"))
        assert by_source == c["lookahead_accepted_tokens"]
        # the same steps vLLM's scheduler counted (its spec-decode counters); vLLM's accepted tokens
        # are the ones the requests kept (engine/metrics/spec_metrics.py), at most one cut step per request
        kept, verified = c["vllm:spec_decode_num_accepted_tokens"], c["lookahead_accepted_tokens"]
        assert c["lookahead_steps"] == c["vllm:spec_decode_num_drafts"]
        assert 0 < kept <= verified
    assert not any(k.startswith("lookahead_") for r in raw["methods"][1]["runs"]["code"] for k in r["counters"])
    assert "## Where lookahead's accepted tokens came from" in md

    # Replaying the recorded no-spec outputs (no engine) predicts the engine's MAT exactly for
    # chain drafts (the lead candidate within a fixed cap; the window cannot be replayed).
    replay = _replay(capsys, "--replay", str(out / "results.json"), "--methods", "ngram", LOOKAHEAD)
    replayed = {}
    for line in replay.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0] == "code":
            replayed[cells[1].split(" (")[0]] = float(cells[2])
    assert set(replayed) == {"ngram k=4 lookup 2..4", LABEL}
    for method, mat in replayed.items():
        # batch-1 MAT counts forwards, which replay reproduces (2026-11-22: equal to 2 decimals, real model)
        assert abs(mat - float(by[(method, "code")]["MAT"])) <= 0.02, (method, mat, by[(method, "code")]["MAT"])

    # --replay-max-tokens replays each completion's first N tokens (= the greedy run with max_tokens N).
    short = _replay(capsys, "--replay", str(out / "results.json"), "--methods", "ngram", "--replay-max-tokens", "10")
    code_rows = [line for line in short.splitlines() if line.startswith("| code |")]
    expected = sum(min(len(o), 10) for r in ref_runs["code"] for o in r["outputs"])
    assert len(code_rows) == 1 and int(code_rows[0].strip("|").split("|")[4]) == expected
