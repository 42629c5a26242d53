"""The serving benchmark's arithmetic and plan, without servers (benchmarks/serving/): ratios
against no speculation within a round and their spread over rounds, outputs compared request by
request, load points derived from the saturation, the method order of each round."""

from __future__ import annotations

import pytest

from benchmarks.methods import parse_method
from benchmarks.serving.client import LoadPoint, Sampling
from benchmarks.serving.plan import Plan, round_order
from benchmarks.serving.report import to_csv, to_markdown
from benchmarks.serving.summary import absolute, outputs_compared, ratios


def _run(rnd, method, tpot, tok_s, texts, point="50% of saturation", rate=0.5):
    summary = {"output_throughput": tok_s, "request_goodput": None, "request_throughput": rate}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "p50", "p90", "p99"):
            summary[f"{stat}_{metric}"] = tpot * (2 if stat == "p99" else 1) * (10 if metric == "ttft" else 1)
    return {
        "round": rnd,
        "method": method,
        "workload": "chat",
        "sampling": "greedy",
        "point": point,
        "rate": rate,
        "burstiness": 1.0,
        "concurrency": None,
        "summary": summary,
        "texts": texts,
        "allocator": "glibc",
    }


RUNS = [
    _run(0, "no-spec", 20.0, 100.0, ["a", "b"]),
    _run(0, "lookahead", 10.0, 150.0, ["a", "b"]),
    _run(1, "lookahead", 16.0, 90.0, ["a", "x"]),
    _run(1, "no-spec", 20.0, 100.0, ["a", "b"]),
]


def test_ratios_are_taken_within_a_round_and_spread_over_rounds():
    (cell,) = ratios(RUNS).values()
    assert cell["mean_tpot"].mean == pytest.approx((2.0 + 1.25) / 2)
    assert (cell["mean_tpot"].low, cell["mean_tpot"].high, cell["mean_tpot"].rounds) == (1.25, 2.0, 2)
    assert cell["output_throughput"].mean == pytest.approx((1.5 + 0.9) / 2)  # ours over theirs
    assert "request_goodput" not in cell  # not measured: no ratio
    assert str(cell["mean_tpot"]) == "1.62 [1.25-2.00]"


def test_outputs_are_compared_request_by_request_with_no_speculation():
    assert outputs_compared(RUNS) == {("lookahead", "greedy"): (3, 4)}
    assert absolute(RUNS)[("chat", "greedy", "50% of saturation")]["mean_tpot"] == 20.0


def test_the_report_names_every_method_and_point():
    raw = {
        "plan": {"model": "m", "max_num_seqs": 4, "max_tokens": 16, "requests": 2},
        "saturation": {"chat/greedy": 1.0},
        "runs": RUNS,
    }
    text = to_markdown(raw)
    assert "**lookahead** against no speculation" in text and "| 50% of saturation | 1.20 [0.90-1.50] |" in text
    assert "| lookahead | greedy | 3 / 4 |" in text
    assert to_csv(raw).count("\n") == 1 + len(RUNS)


def test_load_points_follow_the_saturation_and_rounds_reverse_the_order():
    plan = Plan(model="m", served_model="m", out=None, requests=8, max_num_seqs=4)
    points = plan.points(2.0)
    assert [(p.rate, p.burstiness, p.concurrency) for p in points] == [
        (0.5, 1.0, None),
        (1.0, 1.0, None),
        (1.6, 1.0, None),
        (1.0, 0.5, None),
        (None, 1.0, 4),
    ]
    assert points[-1].requests == 8 and "--max-concurrency" in points[-1].client_args()
    assert LoadPoint("x", 3, 0.25, 0.5).client_args() == [
        "--num-prompts",
        "3",
        "--request-rate",
        "0.2500",
        "--burstiness",
        "0.5",
    ]
    assert "--ignore-eos" in Sampling(0.7, 16).client_args() and "--ignore-eos" not in Sampling(0.0, 16).client_args()
    methods = [parse_method(m) for m in ("none", "ngram", "lookahead")]
    assert [m.label for m in round_order(methods, 1)] == [m.label for m in reversed(methods)]
    assert round_order(methods, 2) == methods
