"""`python -m benchmarks.serving` end to end on the toy model: two servers (no speculation and
lookahead with full trees), vLLM's own client at a saturated, a Poisson and a bursty point, seeded
sampled requests -- small, but every stage real.  Runs in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]


def test_the_serving_benchmark_runs_every_stage(toy_model, tmp_path):
    out = tmp_path / "serving"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.serving",
        "--model",
        toy_model,
        "--methods",
        "none",
        'lookahead:{"max_tokens_per_step": 0}',
        "--workloads",
        "code",
        "--temperatures",
        "0.7",
        "--rounds",
        "1",
        "--requests",
        "6",
        "--max-num-seqs",
        "4",
        "--max-tokens",
        "16",
        "--load-fractions",
        "0.5",
        "--goodput",
        "ttft:5000",
        "--serve-arg=--max-model-len",
        "--serve-arg=1024",
        "--out",
        str(out),
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    raw = json.loads((out / "results.json").read_text())
    runs = raw["runs"]
    # per server: saturated, 50 % of saturation, bursty
    assert len(runs) == 2 * 3 and {r["method"] for r in runs} == {
        "no-spec",
        "lookahead W7 N5 G7 max_tokens_per_step=0",
    }
    assert set(raw["saturation"]) == {"code/T=0.7"} and all(v > 0 for v in raw["saturation"].values())
    saturated = [r for r in runs if r["point"] == "saturated"]
    assert all(r["concurrency"] == 4 and r["summary"]["completed"] == 8 for r in saturated)
    assert all(r["summary"]["completed"] == 6 for r in runs if r["point"] != "saturated")
    # every request's TTFT, and the server's split of it from vLLM's histograms, at every point
    assert all(len(r["ttfts"]) == r["summary"]["completed"] for r in runs)
    assert all(all(v is not None and v >= 0 for v in r["server_ms"].values()) for r in runs)
    assert all(len(r["server_ms"]) == 3 for r in runs)
    text = (out / "results.md").read_text()
    assert "| server: to first token | before the scheduler | queued | prefill |" in text
    assert "**lookahead W7 N5 G7 max_tokens_per_step=0** against no speculation" in text
    # seeded sampled requests: the texts no speculation returns, request by request
    assert "| lookahead W7 N5 G7 max_tokens_per_step=0 | T=0.7 | 20 / 20 |" in text, text
    assert (out / "latency_vs_rate.png").stat().st_size > 0
    for server in (out / "servers").glob("*.log"):  # nothing failed while serving (vLLM's shutdown may log one)
        assert "Traceback" not in server.read_text().split("[shutdown]", 1)[0], server.name
