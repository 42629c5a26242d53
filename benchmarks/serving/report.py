"""The serving benchmark's report: Markdown tables of ratios with their spread, a CSV of every
run, and the classic plot -- latency percentiles against request rate, one curve per method."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.serving.server import SERVER_HISTOGRAMS
from benchmarks.serving.summary import (
    LATENCY,
    REFERENCE,
    THROUGHPUT,
    absolute,
    outputs_compared,
    paired_ttft,
    ratios,
    server_split,
)

COLUMNS = (
    ("output_throughput", "tok/s"),
    ("mean_ttft", "TTFT mean"),
    ("p99_ttft", "TTFT p99"),
    ("mean_tpot", "TPOT mean"),
    ("p99_tpot", "TPOT p99"),
    ("mean_itl", "ITL mean"),
    ("p99_itl", "ITL p99"),
    ("mean_e2el", "E2E mean"),
    ("p99_e2el", "E2E p99"),
    ("request_goodput", "goodput"),
)


def _order(raw: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """Methods (no speculation first), (workload, sampling) pairs and points, in the order run."""
    methods, cells, points = [], [], []
    for run in raw["runs"]:
        for seq, item in (
            (methods, run["method"]),
            (cells, (run["workload"], run["sampling"])),
            (points, run["point"]),
        ):
            if item not in seq:
                seq.append(item)
    saturated = [p for p in points if p == "saturated"]
    return methods, cells, [p for p in points if p != "saturated"] + saturated


def to_markdown(raw: dict[str, Any]) -> str:
    plan, runs = raw["plan"], raw["runs"]
    methods, cells, points = _order(raw)
    table, base = ratios(runs), absolute(runs)
    rounds = 1 + max((r["round"] for r in runs), default=0)
    lines = [
        "# Serving benchmark",
        "",
        f"Model `{plan['model']}`, `--max-num-seqs {plan['max_num_seqs']}`, max_tokens {plan['max_tokens']} "
        f"(greedy at natural lengths; sampled requests seeded, `ignore_eos`), {plan['requests']} requests per "
        f"Poisson point, {rounds} round(s), a fresh server per method and round, method order reversed every other "
        f"round; engines: {runs[0]['allocator'] if runs else '-'}.  Ratios: > 1 is better with the method (no "
        "speculation's latency over the method's; the method's tokens/s and goodput over no speculation's), mean "
        "over rounds [lowest-highest].",
        "",
    ]
    for label, reason in plan.get("skipped", {}).items():
        lines.append(f"* **{label}: not run** -- {reason}")
    for workload, sampling in cells:
        key = f"{workload}/{sampling}"
        lines += [
            f"## {workload}, {sampling}",
            "",
            f"Saturation without speculation: {raw['saturation'].get(key, float('nan')):.3f} requests/s.",
            "",
        ]
        lines += _absolute_table(base, workload, sampling, points)
        for method in methods:
            if method == REFERENCE:
                continue
            lines += [
                f"**{method}** against no speculation:",
                "",
                "| load | " + " | ".join(name for _, name in COLUMNS) + " |",
                "|---|" + "---|" * len(COLUMNS),
            ]
            for point in points:
                cell = table.get((method, workload, sampling, point), {})
                lines.append(
                    f"| {point} | " + " | ".join(str(cell[m]) if m in cell else "-" for m, _ in COLUMNS) + " |"
                )
            lines.append("")
        lines += _ttft_table(runs, methods, workload, sampling, points)
    lines += ["## Outputs", "", "| method | sampling | identical to no speculation |", "|---|---|---|"]
    for (method, sampling), (same, total) in sorted(outputs_compared(runs).items()):
        lines.append(f"| {method} | {sampling} | {same} / {total} |")
    return "\n".join(lines) + "\n"


def _ttft_table(runs: list[dict[str, Any]], methods: list[str], workload: str, sampling: str, points: list[str]):
    """Time to first token request by request against no speculation, and the server's split of it."""
    paired, split = paired_ttft(runs), server_split(runs)
    if not split and not paired:
        return []
    mean = {m: absolute(runs, m) for m in methods}
    lines = [
        "Time to first token (ms): the client's mean; each request's minus the same request's without speculation "
        "(mean ± standard error over the requests of every round); and the server's means over requests from "
        "vLLM's histograms -- from its arrival at the API server to its first token, split into the time before the "
        "scheduler took it (input processing, and the step in progress when it arrived: the engine takes new "
        "requests between steps), queued (to its first scheduled step) and prefill (from that step's start to its "
        "first token, the steps of its prompt); the saturated point's include its 4 warm-up requests:",
        "",
        "| method | load | TTFT | against no speculation | server: to first token | before the scheduler | queued "
        "| prefill |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in methods:
        for point in points:
            cell = mean[method].get((workload, sampling, point), {})
            key = (method, workload, sampling, point)
            diff = paired.get(key)
            server = split.get(key, {})
            lines.append(
                f"| {method} | {point} | "
                + " | ".join(
                    [
                        f"{cell['mean_ttft']:.1f}" if cell.get("mean_ttft") is not None else "-",
                        str(diff) if diff is not None else "-",
                        *(f"{v:.1f}" if v is not None else "-" for v in _server_columns(server)),
                    ]
                )
                + " |"
            )
    return [*lines, ""]


def _server_columns(server: dict[str, float]) -> list[float | None]:
    """To first token, before the scheduler (the rest), queued, prefill: ms, None where not measured."""
    ttft, queued, prefill = (server.get(h) for h in SERVER_HISTOGRAMS)
    before = ttft - queued - prefill if None not in (ttft, queued, prefill) else None
    return [ttft, before, queued, prefill]


def _absolute_table(base: dict, workload: str, sampling: str, points: list[str]) -> list[str]:
    lines = [
        "No speculation (ms; tokens/s, requests/s):",
        "",
        "| load | " + " | ".join(name for _, name in COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for point in points:
        cell = base.get((workload, sampling, point), {})
        lines.append(
            f"| {point} | "
            + " | ".join(f"{cell[m]:.1f}" if cell.get(m) is not None else "-" for m, _ in COLUMNS)
            + " |"
        )
    return [*lines, ""]


def to_csv(raw: dict[str, Any]) -> str:
    out = io.StringIO()
    fields = [
        "round",
        "method",
        "workload",
        "sampling",
        "point",
        "rate",
        "burstiness",
        "concurrency",
        "request_throughput",
        *THROUGHPUT,
        *LATENCY,
    ]
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for run in raw["runs"]:
        writer.writerow({**{k: run.get(k) for k in fields}, **run["summary"]})
    return out.getvalue()


def plot(raw: dict[str, Any], path: Path) -> Path | None:
    """Latency percentiles (TPOT p50/p99, TTFT p99) against the offered request rate, one curve per
    method and one row per workload and sampling; the saturated point at its measured rate."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    methods, cells, _ = _order(raw)
    series: dict[tuple, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for run in raw["runs"]:
        if run["burstiness"] != 1.0:
            continue
        rate = run["rate"] if run["rate"] is not None else run["summary"]["request_throughput"]
        for metric in ("p50_tpot", "p99_tpot", "p99_ttft"):
            series[(run["workload"], run["sampling"], metric)][run["method"]].append((rate, run["summary"][metric]))
    fig, axes = plt.subplots(len(cells), 3, figsize=(15, 4 * len(cells)), squeeze=False)
    for row, (workload, sampling) in enumerate(cells):
        for col, metric in enumerate(("p50_tpot", "p99_tpot", "p99_ttft")):
            ax = axes[row][col]
            for method in methods:
                points = defaultdict(list)
                for rate, value in series[(workload, sampling, metric)].get(method, []):
                    points[round(rate, 3)].append(value)
                xs = sorted(points)
                ax.plot(xs, [sum(points[x]) / len(points[x]) for x in xs], marker="o", label=method)
            ax.set_title(f"{workload}, {sampling}: {metric.replace('_', ' ')} (ms)")
            ax.set_xlabel("request rate (requests/s)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(raw: dict[str, Any], out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "csv": out / "results.csv"}
    paths["json"].write_text(json.dumps(raw, indent=1))
    paths["markdown"].write_text(to_markdown(raw))
    paths["csv"].write_text(to_csv(raw))
    figure = plot(raw, out / "latency_vs_rate.png")
    if figure is not None:
        paths["plot"] = figure
    return {k: str(v) for k, v in paths.items()}
