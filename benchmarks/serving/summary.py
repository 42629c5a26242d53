"""The serving benchmark's figures: each method against no speculation, run by run.

A ratio is taken within one round (the same requests at the same moments, servers started the
same way) and reads "> 1: better with the method": no speculation's latency over the method's
for TTFT, TPOT, ITL and end-to-end latency (mean and p99), the method's output tokens/s and
goodput over no speculation's.  Over rounds: the mean and the spread (lowest, highest).
Outputs: the texts each request got, compared with no speculation's of the same round and point
(greedy requests must match; seeded sampled ones return vLLM's own tokens).

Time to first token is also compared request by request (:func:`paired_ttft`): every method gets
the same requests at the same moments, so the difference of one request's TTFT from no
speculation's removes most of what moves a point's mean between rounds (where in a step the
request arrived, how long its prompt is); and the server's split of it (:func:`server_split`,
the histograms of :data:`~benchmarks.serving.server.SERVER_HISTOGRAMS`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

LATENCY = tuple(f"{stat}_{metric}" for metric in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "p99"))
THROUGHPUT = ("output_throughput", "request_goodput")
REFERENCE = "no-spec"


@dataclass(frozen=True)
class Paired:
    """A method's per-request TTFT minus no speculation's, over the requests of every round (ms)."""

    mean: float
    stderr: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:+.1f} ± {self.stderr:.1f}"


@dataclass(frozen=True)
class Ratio:
    mean: float
    low: float
    high: float
    rounds: int

    def __str__(self) -> str:
        spread = f" [{self.low:.2f}-{self.high:.2f}]" if self.rounds > 1 else ""
        return f"{self.mean:.2f}{spread}"


def _key(run: dict[str, Any]) -> tuple:
    return run["round"], run["workload"], run["sampling"], run["point"]


def ratios(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Ratio]]:
    """(method, workload, sampling, point) -> metric -> :class:`Ratio` against no speculation."""
    reference = {_key(r): r["summary"] for r in runs if r["method"] == REFERENCE}
    per_round: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        base = reference.get(_key(run))
        if run["method"] == REFERENCE or base is None:
            continue
        cell = per_round[(run["method"], run["workload"], run["sampling"], run["point"])]
        for metric in (*LATENCY, *THROUGHPUT):
            ours, theirs = run["summary"].get(metric), base.get(metric)
            if ours is None or theirs is None or ours <= 0 or theirs <= 0:
                continue
            cell[metric].append(theirs / ours if metric in LATENCY else ours / theirs)
    return {
        key: {m: Ratio(statistics.fmean(v), min(v), max(v), len(v)) for m, v in cell.items()}
        for key, cell in per_round.items()
    }


def outputs_compared(runs: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, int]]:
    """(method, sampling) -> (requests whose text equals no speculation's, requests compared)."""
    reference = {_key(r): r["texts"] for r in runs if r["method"] == REFERENCE}
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for run in runs:
        base = reference.get(_key(run))
        if run["method"] == REFERENCE or base is None:
            continue
        cell = counts[(run["method"], run["sampling"])]
        cell[0] += sum(a == b for a, b in zip(run["texts"], base))
        cell[1] += min(len(run["texts"]), len(base))
    return {k: (v[0], v[1]) for k, v in counts.items()}


def absolute(runs: list[dict[str, Any]], method: str = REFERENCE) -> dict[tuple[str, str, str], dict[str, float]]:
    """(workload, sampling, point) -> metric -> ``method``'s mean over rounds (ms, tokens/s)."""
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if run["method"] != method:
            continue
        for metric, value in run["summary"].items():
            if isinstance(value, (int, float)):
                cells[(run["workload"], run["sampling"], run["point"])][metric].append(float(value))
    return {k: {m: statistics.fmean(v) for m, v in cell.items()} for k, cell in cells.items()}


def paired_ttft(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], Paired]:
    """(method, workload, sampling, point) -> :class:`Paired`: each request's TTFT minus the same
    request's without speculation in the same round, pooled over rounds."""
    reference = {_key(r): r.get("ttfts") or [] for r in runs if r["method"] == REFERENCE}
    diffs: dict[tuple, list[float]] = defaultdict(list)
    for run in runs:
        base = reference.get(_key(run))
        if run["method"] == REFERENCE or not base or not run.get("ttfts"):
            continue
        diffs[(run["method"], run["workload"], run["sampling"], run["point"])] += [
            ours - theirs for ours, theirs in zip(run["ttfts"], base)
        ]
    return {
        key: Paired(statistics.fmean(d), statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan"), len(d))
        for key, d in diffs.items()
    }


def server_split(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, float]]:
    """(method, workload, sampling, point) -> server histogram -> its mean (ms), over rounds."""
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for name, value in (run.get("server_ms") or {}).items():
            if value is not None:
                cells[(run["method"], run["workload"], run["sampling"], run["point"])][name].append(value)
    return {k: {m: statistics.fmean(v) for m, v in cell.items()} for k, cell in cells.items()}
