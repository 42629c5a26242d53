"""The serving benchmark's sweep: methods x rounds x workloads x samplings x load points.

No speculation runs first in the first round; its saturated point -- ``max_num_seqs`` requests in
flight and a queue behind them -- measures the request rate the server sustains, and the
Poisson rates of every method and round are fractions of it (``load_fractions``), with one bursty
point (gamma arrivals, ``burstiness``).  Each method gets a fresh server per round; the method
order is reversed every other round.  Every run is written to ``runs.jsonl`` as it ends, so a cut
run keeps what it measured.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.methods import Method, parse_method
from benchmarks.serving.client import METRICS, Client, LoadPoint, Sampling, bench_argv
from benchmarks.serving.server import Server, histogram_means_ms
from benchmarks.serving.workloads import write_dataset

SUMMARY_KEYS = (
    "completed",
    "duration",
    "request_throughput",
    "output_throughput",
    "request_goodput",
    "total_output_tokens",
    "max_concurrent_requests",
)


@dataclass
class Plan:
    model: str
    served_model: str
    out: Path
    methods: list[str] = field(default_factory=lambda: ["none", "ngram", "lookahead"])
    workloads: list[str] = field(default_factory=lambda: ["chat"])
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7])
    rounds: int = 3
    requests: int = 32  # per Poisson point
    max_num_seqs: int = 32
    max_tokens: int = 128
    load_fractions: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.8])
    bursty_fraction: float = 0.5
    burstiness: float = 0.5
    serve_args: list[str] = field(default_factory=list)
    goodput: list[str] = field(default_factory=list)
    inherit_malloc: bool = False

    @property
    def saturated(self) -> LoadPoint:
        """``max_num_seqs`` in flight and as many queued behind them."""
        return LoadPoint("saturated", 2 * self.max_num_seqs, None, 1.0, self.max_num_seqs)

    def points(self, saturation: float) -> list[LoadPoint]:
        points = [LoadPoint(f"{f:.0%} of saturation", self.requests, f * saturation) for f in self.load_fractions]
        points.append(
            LoadPoint(
                f"{self.bursty_fraction:.0%}, bursty {self.burstiness:g}",
                self.requests,
                self.bursty_fraction * saturation,
                self.burstiness,
            )
        )
        return [*points, self.saturated]

    def samplings(self) -> list[Sampling]:
        return [Sampling(t, self.max_tokens) for t in self.temperatures]


def round_order(methods: list[Method], rnd: int) -> list[Method]:
    """Round ``rnd``'s method order: as given (no speculation first), reversed every other round."""
    return list(methods) if rnd % 2 == 0 else list(reversed(methods))


def run_plan(plan: Plan, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every method, round, workload, sampling and point; the raw results (also written to
    ``plan.out``: ``plan.json``, ``runs.jsonl``, each run's vLLM JSON and each server's log)."""
    methods = [parse_method(m) for m in plan.methods]
    if methods[0].speculative_config is not None:
        raise ValueError("the first method must be 'none' (no speculation): the reference and the saturation probe")
    skipped = {m.label: m.skip_reason for m in methods if m.skip_reason}
    methods = [m for m in methods if not m.skip_reason]
    plan.out.mkdir(parents=True, exist_ok=True)
    datasets = {
        w: write_dataset(w, max(plan.requests, plan.saturated.requests), plan.out / "datasets")[0]
        for w in plan.workloads
    }
    (plan.out / "plan.json").write_text(
        json.dumps({**asdict(plan), "out": str(plan.out), "skipped": skipped}, indent=1)
    )
    saturation: dict[str, float] = {}  # "workload/sampling" -> requests per second without speculation
    runs: list[dict[str, Any]] = []
    serve = ["--served-model-name", plan.served_model, "--max-num-seqs", str(plan.max_num_seqs), *plan.serve_args]
    for rnd in range(plan.rounds):
        for method in round_order(methods, rnd):
            stem = f"r{rnd}-{method.label.replace(' ', '_').replace('/', '_')}"
            server = Server(method, plan.model, serve, plan.out / "servers" / f"{stem}.log", plan.inherit_malloc)
            client = Client(plan.out / "clients" / f"{stem}.log")
            try:
                log(f"round {rnd + 1}/{plan.rounds}: {method.label}: server up in {server.wait_ready():.0f} s")
                runs += _run_server(plan, _Target(method, rnd, server, client), datasets, saturation, log)
            finally:
                client.close()
                server.stop()
    return {"plan": json.loads((plan.out / "plan.json").read_text()), "saturation": saturation, "runs": runs}


@dataclass(frozen=True)
class _Target:
    """One method's server in one round, and the client process that loads it."""

    method: Method
    rnd: int
    server: Server
    client: Client


def _run_server(
    plan: Plan, target: _Target, datasets: dict[str, Path], saturation: dict[str, float], log: Callable[[str], None]
) -> list[dict[str, Any]]:
    runs = []
    for workload, dataset in datasets.items():
        for sampling in plan.samplings():
            key = f"{workload}/{sampling.name}"
            # the saturated point first, after a few requests that warm the server up
            runs.append(_point(plan, target, workload, dataset, plan.saturated, sampling, log, warmups=4))
            if key not in saturation:  # no speculation, first round: the reference rate
                saturation[key] = runs[-1]["summary"]["request_throughput"]
                log(f"saturation of {key} without speculation: {saturation[key]:.3f} requests/s")
            for point in plan.points(saturation[key])[:-1]:
                runs.append(_point(plan, target, workload, dataset, point, sampling, log))
    return runs


def _point(
    plan: Plan,
    target: _Target,
    workload: str,
    dataset: Path,
    point: LoadPoint,
    sampling: Sampling,
    log: Callable[[str], None],
    warmups: int = 0,
) -> dict[str, Any]:
    method, server = target.method, target.server
    name = f"r{target.rnd}-{method.label}-{workload}-{sampling.name}-{point.name}"
    result = plan.out / "runs" / ("".join(c if c.isalnum() or c in "-_." else "_" for c in name) + ".json")
    start = time.monotonic()
    argv = bench_argv(
        server.base, plan.served_model, plan.model, dataset, point, sampling, result, plan.goodput, warmups
    )
    try:
        before = server.histogram_totals()
        data = target.client.run(argv, result)
        server_ms = histogram_means_ms(before, server.histogram_totals())
    except (RuntimeError, OSError) as exc:  # OSError: the server's /metrics did not answer
        raise RuntimeError(f"{name}: {exc}\nserver log ({server.log_path}):\n{server.tail(15)}") from None
    summary = {k: data.get(k) for k in SUMMARY_KEYS}
    for metric in METRICS:
        for stat in ("mean", "p50", "p90", "p99"):
            summary[f"{stat}_{metric}"] = data.get(f"{stat}_{metric}_ms")
    record = {
        "round": target.rnd,
        "method": method.label,
        "spec": method.spec,
        "workload": workload,
        "sampling": sampling.name,
        "temperature": sampling.temperature,
        "point": point.name,
        "rate": point.rate,
        "burstiness": point.burstiness,
        "concurrency": point.concurrency,
        "summary": summary,
        "texts": data.get("generated_texts", []),
        # each request's TTFT (ms), in the dataset's order: the same request at the same moment in every method
        "ttfts": [1e3 * t for t in data.get("ttfts", [])],
        "server_ms": server_ms,
        "allocator": server.allocator,
    }
    with open(plan.out / "runs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    log(
        f"  {method.label} {workload} {sampling.name} {point.name}: {summary['output_throughput']:.1f} tok/s, "
        f"TPOT {summary['mean_tpot']:.1f} ms, TTFT {summary['mean_ttft']:.0f} ms ({time.monotonic() - start:.0f} s)"
    )
    return record
