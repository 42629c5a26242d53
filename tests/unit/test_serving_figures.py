"""The serving benchmark's arithmetic and plan, without servers (benchmarks/serving/): ratios
against no speculation within a round and their spread over rounds, outputs compared request by
request, load points derived from the saturation, the method order of each round."""

from __future__ import annotations

import pytest

from benchmarks.methods import parse_method
from benchmarks.serving.client import LoadPoint, Sampling
from benchmarks.serving.plan import Plan, round_order
from benchmarks.serving.report import to_csv, to_markdown
from benchmarks.serving.server import SERVER_HISTOGRAMS, histogram_means_ms, histogram_totals
from benchmarks.serving.summary import absolute, outputs_compared, paired_ttft, ratios, server_split


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


EXPOSITION = """\
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 3.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.5
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 4.0
vllm:request_queue_time_seconds_sum{engine="1",model_name="m"} 0.25
vllm:request_queue_time_seconds_count{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
"""


def test_server_histograms_are_summed_over_engines_and_differenced_over_a_point():
    totals = histogram_totals(EXPOSITION)
    queued = SERVER_HISTOGRAMS[1]
    assert totals[queued] == (0.75, 5.0)
    assert totals[SERVER_HISTOGRAMS[0]] == (0.0, 0.0)  # absent: nothing observed
    after = {**totals, queued: (1.75, 7.0)}
    means = histogram_means_ms(totals, after)
    assert means[queued] == pytest.approx(500.0) and means[SERVER_HISTOGRAMS[0]] is None


def test_ttft_is_paired_request_by_request_and_the_report_shows_the_split():
    runs = [dict(r, ttfts=[100.0, 200.0, 300.0]) for r in RUNS]
    runs[1] = dict(runs[1], ttfts=[110.0, 230.0, 290.0], server_ms={SERVER_HISTOGRAMS[1]: 40.0})
    runs[2] = dict(runs[2], ttfts=[100.0, 210.0, 330.0], server_ms={SERVER_HISTOGRAMS[1]: 60.0})
    (cell,) = paired_ttft(runs).values()
    diffs = [10.0, 30.0, -10.0, 0.0, 10.0, 30.0]  # rounds 0 and 1, each against its own round
    assert cell.n == 6 and cell.mean == pytest.approx(sum(diffs) / 6)
    assert str(cell).startswith("+11.7 ± ")
    (split,) = server_split(runs).values()
    assert split == {SERVER_HISTOGRAMS[1]: 50.0}
    text = to_markdown(
        {
            "plan": {"model": "m", "max_num_seqs": 4, "max_tokens": 16, "requests": 2},
            "runs": runs,
            "saturation": {"chat/greedy": 1.0},
        }
    )
    assert "| lookahead | 50% of saturation | 130.0 | +11.7 ± " in text and "| - | - | 50.0 | - |" in text
