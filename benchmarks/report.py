"""Turn raw benchmark results (``results.json``) into tables and plots.

Per method and workload (a prompt category at batch 1, or a concurrency level):

* **MAT** -- generated tokens / target forwards.  With one request in flight
  (batch-1 categories, concurrency 1) the forwards are counted directly (the
  runner's ``execute_model`` calls).  With more, every forward of a request
  yields exactly one token that was not a draft, so its forwards = generated -
  accepted drafts (vLLM's ``vllm:generation_tokens`` and
  ``vllm:spec_decode_num_accepted_tokens``).  For vLLM's own methods that
  overstates MAT a little: vLLM counts drafts accepted on a request's last step
  even where they fall past ``max_tokens`` or after the stop token and are
  discarded (measured at batch 1 on 2026-11-22: lookahead, then counted the same
  way, 2.89 by counters against 2.81 by forwards on MT-bench).  Lookahead's
  counters count kept tokens only (:mod:`vllm_lookahead.engine.metrics.spec_metrics`).
* **acceptance** -- accepted draft tokens / draft tokens.  For lookahead a draft
  token is a position of the tree's depth (what a chain of that depth would have
  sent; :mod:`vllm_lookahead.engine.metrics.spec_metrics`), so it reads as for a linear drafter.
* **draft/step** -- draft tokens the target ran per drafting step: the chain's
  length, or for lookahead the tree's node count (window and all candidates).
* **tok/s** -- generated tokens / wall time of the workload; **speedup** is the
  ratio to no speculation, repeat by repeat; reported as mean and [min, max].
  With several requests in flight and nothing waiting (a closed wave: every request
  sent at once), the wall time is the time of the request that finishes last.
* **latency speedup** -- mean time from adding a request to its last token, no
  speculation's over the method's, repeat by repeat, mean: what a user of the server
  waits.  In a closed wave it differs from the speedup where a method speeds up some
  requests and not the others (those finishing first leave the rest no faster).
* **TTFT** -- mean time from adding a request to its first token.
* **propose, verify ms/step** -- wall time per engine step in the drafter
  (``propose_draft_token_ids``) and in sampling/verification (``_sample``), as
  timed in-process by :class:`~benchmarks.driver.StepTimers`.
* **exact** -- completions token-identical to no speculation (same prompts, same repeat);
  greedy workloads only (a sampled workload keeps the distribution, not the tokens).

Sampled category workloads (``--temperatures``) and category workloads with several
requests in flight (``--category-concurrency``) also get a summary per (requests in
flight, temperature): MAT and speedup of every method per category, side by side.

For lookahead methods, **where the accepted tokens came from** (the runner's own
counters, :mod:`vllm_lookahead.engine.metrics.stats`): per tree step, draft tokens, how
often the Jacobi window ran and how many nodes it added, and accepted tokens per
source -- n-grams of the prompt, of the output, or ones only the window produced
(:mod:`vllm_lookahead.core.source`).

A last table, **where a step's time goes**, splits the wall time of an engine
step (``engine.step()``) into the runner's ``execute_model`` (input preparation +
model forward), ``sample_tokens`` (verification, drafting, output bookkeeping)
and the rest (scheduler, output processing), and gives the forward's time at
equal shapes -- the same number of tokens in the forward -- for every method.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.counters import mean_accepted_tokens

COLUMNS = (
    "method",
    "workload",
    "concurrency",
    "temperature",
    "requests",
    "tokens",
    "MAT",
    "acceptance",
    "draft_per_step",
    "tok_s",
    "speedup",
    "speedup_min",
    "speedup_max",
    "latency_speedup",
    "ttft_ms",
    "step_ms",
    "attention_ms",
    "propose_ms",
    "verify_ms",
    "exact",
    "compared",
)


@dataclass
class Row:
    method: str
    workload: str
    kind: str
    concurrency: int
    requests: int
    tokens: int
    mat: float
    acceptance: float
    draft_per_step: float
    tok_s: float
    speedup: float
    speedup_min: float
    speedup_max: float
    latency_speedup: float
    ttft_ms: float
    step_ms: float
    attention_ms: float
    propose_ms: float
    verify_ms: float
    exact: int
    compared: int
    temperature: float = 0.0
    category: str = ""

    def as_csv(self) -> list[Any]:
        return [
            self.method,
            self.workload,
            self.concurrency,
            self.temperature,
            self.requests,
            self.tokens,
            _r(self.mat),
            _r(self.acceptance, 4),
            _r(self.draft_per_step),
            _r(self.tok_s),
            _r(self.speedup, 3),
            _r(self.speedup_min, 3),
            _r(self.speedup_max, 3),
            _r(self.latency_speedup, 3),
            _r(self.ttft_ms, 1),
            _r(self.step_ms),
            _r(self.attention_ms),
            _r(self.propose_ms, 3),
            _r(self.verify_ms, 3),
            self.exact,
            self.compared,
        ]


def _r(x: float, nd: int = 2) -> float | str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)


def _draft_nodes(runs: list[dict], drafted: float) -> float:
    """Draft tokens the target ran: lookahead's tree nodes where it counted them, else vLLM's count."""
    nodes = _sum(runs, "counters", "lookahead_draft_tokens")
    return nodes if nodes else drafted


def _sum(runs: list[dict], section: str, key: str) -> float:
    return sum(float(r[section].get(key, 0.0)) for r in runs)


def _tps(run: dict) -> float:
    tokens = sum(len(o) for o in run["outputs"])
    return tokens / run["wall_s"] if run["wall_s"] > 0 else math.nan


def _mean_latency(run: dict) -> float:
    return mean(run["latency_s"]) if run.get("latency_s") else math.nan


def build_rows(raw: dict[str, Any]) -> list[Row]:
    methods = [m for m in raw["methods"] if not m.get("skip_reason")]
    if not methods:
        return []
    ref = methods[0]
    kinds = {w["name"]: (w["kind"], w["concurrency"]) for w in raw["workloads"]}
    temps = {w["name"]: float(w.get("temperature", 0.0)) for w in raw["workloads"]}
    cats = {w["name"]: w.get("category") or w["name"] for w in raw["workloads"]}
    rows: list[Row] = []
    for m in methods:
        for name, runs in m["runs"].items():
            if not runs:
                continue
            kind, conc = kinds.get(name, ("category", 1))
            sampled = temps.get(name, 0.0) > 0
            ref_runs = ref["runs"].get(name, [])
            gen = _sum(runs, "counters", "vllm:generation_tokens")
            acc = _sum(runs, "counters", "vllm:spec_decode_num_accepted_tokens")
            drafted = _sum(runs, "counters", "vllm:spec_decode_num_draft_tokens")
            drafts = _sum(runs, "counters", "vllm:spec_decode_num_drafts")
            steps = _sum(runs, "timers", "step_calls")
            tokens = sum(len(o) for r in runs for o in r["outputs"])
            if conc == 1 and steps:
                # One request at a time: count the forwards, and the accepted drafts that were kept.
                gen, acc = tokens, tokens - steps
            ratios = [_tps(r) / _tps(b) for r, b in zip(runs, ref_runs) if _tps(b) > 0]
            waits = [_mean_latency(b) / _mean_latency(r) for r, b in zip(runs, ref_runs) if _mean_latency(r) > 0]
            ttfts = [t for r in runs for t in r["ttft_s"]]
            pairs = (
                []
                if sampled
                else [(a, b) for r, ref_run in zip(runs, ref_runs) for a, b in zip(r["outputs"], ref_run["outputs"])]
            )
            rows.append(
                Row(
                    method=m["method"],
                    workload=name,
                    kind=kind,
                    concurrency=conc,
                    requests=sum(len(r["outputs"]) for r in runs),
                    tokens=tokens,
                    mat=mean_accepted_tokens(
                        {"vllm:generation_tokens": gen, "vllm:spec_decode_num_accepted_tokens": acc}
                    ),
                    acceptance=acc / drafted if drafted else math.nan,
                    draft_per_step=_draft_nodes(runs, drafted) / drafts if drafts else 0.0,
                    tok_s=mean(_tps(r) for r in runs),
                    speedup=mean(ratios) if ratios else math.nan,
                    speedup_min=min(ratios) if ratios else math.nan,
                    speedup_max=max(ratios) if ratios else math.nan,
                    latency_speedup=mean(waits) if waits else math.nan,
                    ttft_ms=1e3 * mean(ttfts) if ttfts else math.nan,
                    step_ms=1e3 * _sum(runs, "timers", "step_s") / steps if steps else math.nan,
                    attention_ms=1e3 * _sum(runs, "timers", "attention_s") / steps
                    if steps and _sum(runs, "timers", "attention_calls")
                    else math.nan,
                    propose_ms=1e3 * _sum(runs, "timers", "propose_s") / steps if steps else math.nan,
                    verify_ms=1e3 * _sum(runs, "timers", "verify_s") / steps if steps else math.nan,
                    exact=sum(a == b for a, b in pairs),
                    compared=len(pairs),
                    temperature=temps.get(name, 0.0),
                    category=cats.get(name, name),
                )
            )
    return rows


def to_csv(rows: list[Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow(r.as_csv())
    return buf.getvalue()


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _table(rows: list[Row], first_col: str) -> list[str]:
    lines = [
        f"| method | {first_col} | MAT | accept | draft/step | tok/s | speedup [min, max] | latency speedup | TTFT ms "
        "| step ms | attention ms/step | propose ms/step | verify ms/step | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        where = r.workload if first_col == "category" else str(r.concurrency)
        speed = f"{_fmt(r.speedup, '.2f')}x [{_fmt(r.speedup_min, '.2f')}, {_fmt(r.speedup_max, '.2f')}]"
        lines.append(
            f"| {r.method} | {where} | {_fmt(r.mat, '.2f')} | {_fmt(100 * r.acceptance, '.1f')}% | "
            f"{_fmt(r.draft_per_step, '.1f')} | {_fmt(r.tok_s, '.1f')} | {speed} | {_fmt(r.latency_speedup, '.2f')}x | "
            f"{_fmt(r.ttft_ms, '.0f')} | "
            f"{_fmt(r.step_ms, '.1f')} | {_fmt(r.attention_ms, '.1f')} | "
            f"{_fmt(r.propose_ms, '.2f')} | {_fmt(r.verify_ms, '.2f')} | "
            f"{'sampled' if r.temperature > 0 else f'{r.exact}/{r.compared}'} |"
        )
    return lines


def to_markdown(raw: dict[str, Any], rows: list[Row], plots: list[str] = ()) -> str:
    plan, env = raw["plan"], raw["environment"]
    lines = [
        f"# Benchmark {env.get('date', '')}",
        "",
        f"Machine: {env.get('cpus')} CPUs ({env.get('cpu', env.get('machine'))}); vLLM {env.get('vllm')}, "
        f"torch {env.get('torch')}, vllm-lookahead {env.get('vllm_lookahead')}, Python {env.get('python')}"
        f"{'; engines: ' + env['engine_allocator'] if env.get('engine_allocator') else ''}.",
        f"Model: `{plan['model']}`; {_temperatures(plan)}; max_tokens {plan['max_tokens']}{_sweep_tokens(plan)}"
        f"{' (ignore_eos: every request generates max_tokens)' if plan.get('ignore_eos') else ''}; "
        f"{plan['repeats']} repeats, "
        "each on its own prompts (no prompt is seen twice by an engine); "
        f"same engine settings for every method (max_model_len {plan['max_model_len']}, "
        f"eager={plan['enforce_eager']}, prefix caching off, max_num_seqs = max concurrency).",
        "",
    ]
    skipped = [m for m in raw["methods"] if m.get("skip_reason")]
    for m in skipped:
        lines.append(f"* **{m['method']}: not run** -- {m['skip_reason']}")
    if skipped:
        lines.append("")
    cat = [r for r in rows if r.kind == "category"]
    conc = [r for r in rows if r.kind == "concurrency"]
    if cat:
        order = {n: i for i, n in enumerate(plan["categories"])}
        variants = sorted({(r.concurrency, r.temperature) for r in cat})
        if variants != [(1, 0.0)]:
            lines += summary_tables(raw, cat, variants, order)
        for c, t in variants:
            title = "Batch 1" if c == 1 else f"{c} requests in flight"
            title += f", temperature {t:g}" if t else ""
            lines += [f"## {title}, per prompt category" + (" (greedy)" if not t and len(variants) > 1 else ""), ""]
            part = [r for r in cat if (r.concurrency, r.temperature) == (c, t)]
            lines += _table(
                sorted(part, key=lambda r: (order.get(r.category, 99), _method_order(raw, r.method))), "category"
            )
            lines.append("")
    if conc:
        lines += ["## Concurrency sweep (ShareGPT prompts, closed loop)", ""]
        lines += _table(sorted(conc, key=lambda r: (r.concurrency, _method_order(raw, r.method))), "concurrency")
        lines.append("")
    lines += source_table(raw)
    lines += step_breakdown(raw)
    for p in plots:
        lines += [f"![{Path(p).stem}]({Path(p).name})", ""]
    lines += [
        "MAT = generated tokens / target forwards (counted at one request in flight; from vLLM's counters, "
        "which also count drafts accepted past the end of a completion, above that); "
        "accept = accepted / drafted tokens (a lookahead tree counts "
        "every node); speedup = tok/s over no speculation, per repeat, mean [min, max]; latency speedup = "
        "mean request latency of no speculation over the method's, per repeat, mean; exact = completions "
        "identical to no speculation.",
        "",
    ]
    return "\n".join(lines)


def summary_tables(raw: dict[str, Any], cat: list[Row], variants: list[tuple[int, float]], order: dict) -> list[str]:
    """Per (requests in flight, temperature): a row per category, MAT / speedup per method (and, with
    several requests in flight, the latency speedup)."""
    labels = [m["method"] for m in raw["methods"] if not m.get("skip_reason")][1:]
    lines = [
        "## Summary: MAT / speedup over no speculation, per category",
        "",
        "With several requests in flight: MAT / speedup (tok/s) / latency speedup (mean request latency).",
        "",
    ]
    for c, t in variants:
        part = {(r.category, r.method): r for r in cat if (r.concurrency, r.temperature) == (c, t)}
        lines += [
            f"**{c} in flight, {'greedy' if not t else f'temperature {t:g}'}**",
            "",
            "| category | " + " | ".join(labels) + " |",
            "|---|" + "---|" * len(labels),
        ]
        for category in sorted({k[0] for k in part}, key=lambda x: order.get(x, 99)):
            cells = []
            for label in labels:
                r = part.get((category, label))
                wait = f" / {_fmt(r.latency_speedup, '.2f')}x" if r is not None and c > 1 else ""
                cells.append("-" if r is None else f"{_fmt(r.mat, '.2f')} / {_fmt(r.speedup, '.2f')}x{wait}")
            lines.append(f"| {category} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


SOURCES = ("prompt", "output", "window")


def source_table(raw: dict[str, Any]) -> list[str]:
    """Markdown: per lookahead method and workload, what the trees held and where accepted tokens came from."""
    lines = [
        "## Where lookahead's accepted tokens came from",
        "",
        "Per tree step (a forward that carried a lookahead draft): `MAT` = 1 + accepted drafts per step; "
        "`draft` = draft tokens; `window` = share of steps whose tree held the Jacobi window and its nodes "
        "per such step; then accepted tokens per step from n-grams of the prompt, of the output, and "
        "ones only the window produced (share of all accepted in parentheses).",
        "",
        "| method | workload | tree steps | MAT | draft | window on | window nodes | from prompt | from output "
        "| from window |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    header_len = len(lines)
    order = {w["name"]: i for i, w in enumerate(raw["workloads"])}
    for m in raw["methods"]:
        if m.get("skip_reason"):
            continue
        for name in sorted(m["runs"], key=lambda n: order.get(n, 99)):
            runs = m["runs"][name]
            steps = _sum(runs, "counters", "lookahead_steps")
            if not steps:
                continue
            accepted = _sum(runs, "counters", "lookahead_accepted_tokens")
            window_steps = _sum(runs, "counters", "lookahead_window_steps")
            window_nodes = _sum(runs, "counters", "lookahead_window_tokens")
            cells = []
            for source in SOURCES:
                n = _sum(runs, "counters", f"lookahead_accepted_{source}")
                cells.append(f"{n / steps:.2f} ({_fmt(100 * n / accepted if accepted else math.nan, '.0f')}%)")
            lines.append(
                f"| {m['method']} | {name} | {int(steps)} | {1 + accepted / steps:.2f} | "
                f"{_sum(runs, 'counters', 'lookahead_draft_tokens') / steps:.1f} | {100 * window_steps / steps:.0f}% | "
                f"{_fmt(window_nodes / window_steps if window_steps else math.nan, '.1f')} | "
                + " | ".join(cells)
                + " |"
            )
    lines.append("")
    return lines if len(lines) > header_len + 1 else []


def forward_shapes(runs: list[dict]) -> dict[int, list[float]]:
    """Tokens in the forward -> [calls, seconds] of execute_model, summed over runs."""
    shapes: dict[int, list[float]] = {}
    for r in runs:
        for key, calls in r["timers"].items():
            if key.startswith("forward") and key.endswith("_calls"):
                tokens = int(key[len("forward") : -len("_calls")])
                entry = shapes.setdefault(tokens, [0.0, 0.0])
                entry[0] += calls
                entry[1] += float(r["timers"].get(f"forward{tokens}_s", 0.0))
    return shapes


def step_breakdown(raw: dict[str, Any], num_shapes: int = 3) -> list[str]:
    """Markdown: per workload and method, ms per engine step in forward / sampling / the rest,
    and forward ms at equal shapes (same tokens in the forward, same prompts)."""
    methods = [m for m in raw["methods"] if not m.get("skip_reason")]
    kinds = {w["name"]: (w["kind"], w["concurrency"]) for w in raw["workloads"]}
    groups: dict[str, dict[str, list[dict]]] = {}  # group -> method -> runs
    for m in methods:
        for name, runs in m["runs"].items():
            kind, conc = kinds.get(name, ("category", 1))
            # per workload: pooling categories would compare forwards over different context lengths
            group = f"{name} (batch 1)" if kind == "category" else f"{conc} in flight"
            groups.setdefault(group, {}).setdefault(m["method"], []).extend(runs)
    lines = [
        "## Where a step's time goes",
        "",
        "ms per engine step: `forward` = the runner's execute_model (inputs + model forward), `sample` = "
        "sample_tokens (of which verify and propose), `rest` = scheduler and output processing.  "
        "`forward @ T` = execute_model ms when the forward holds T tokens (calls in parentheses), over the "
        "same prompts: methods compared at equal shapes.  Engines run one after another, so these also show "
        "how much two engines' speed differs (a few per cent on this VM even for identical step sequences).",
        "",
    ]
    header_len = len(lines)
    for group, per_method in groups.items():
        if not any(_sum(runs, "timers", "engine_step_calls") for runs in per_method.values()):
            continue  # results from before these timers existed
        shapes_of = {label: forward_shapes(runs) for label, runs in per_method.items()}
        pooled: dict[int, float] = {}
        for shape in shapes_of.values():
            for tokens, (calls, _) in shape.items():
                pooled[tokens] = pooled.get(tokens, 0.0) + calls
        shapes = sorted(sorted(pooled, key=lambda t: -pooled[t])[:num_shapes])
        lines += [
            f"**{group}**",
            "",
            "| method | engine step ms | forward | sample | verify | propose | rest | "
            + " | ".join(f"forward @ {t}" for t in shapes)
            + " |",
            "|---|---|---|---|---|---|---|" + "---|" * len(shapes),
        ]
        for label in sorted(per_method, key=lambda lbl: _method_order(raw, lbl)):
            runs = per_method[label]
            n = _sum(runs, "timers", "engine_step_calls")
            if not n:
                continue
            ms = {
                k: 1e3 * _sum(runs, "timers", f"{k}_s") / n
                for k in ("engine_step", "step", "sample", "verify", "propose")
            }
            rest = ms["engine_step"] - ms["step"] - ms["sample"]
            shape = shapes_of[label]
            at = [
                f"{1e3 * shape[t][1] / shape[t][0]:.1f} ({int(shape[t][0])})" if shape.get(t, [0])[0] else "-"
                for t in shapes
            ]
            lines.append(
                f"| {label} | {ms['engine_step']:.1f} | {ms['step']:.1f} | {ms['sample']:.1f} | {ms['verify']:.2f} | "
                f"{ms['propose']:.2f} | {rest:.1f} | " + " | ".join(at) + " |"
            )
        lines.append("")
    return lines if len(lines) > header_len else []


def _method_order(raw: dict[str, Any], label: str) -> int:
    for i, m in enumerate(raw["methods"]):
        if m["method"] == label:
            return i
    return 99


def plot(raw: dict[str, Any], rows: list[Row], out_dir: Path) -> list[str]:
    """speedup_vs_concurrency.png and mat_per_category.png; [] if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[str] = []
    labels = [m["method"] for m in raw["methods"] if not m.get("skip_reason")]
    conc = [r for r in rows if r.kind == "concurrency"]
    if conc:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label in labels:
            pts = sorted((r.concurrency, r.speedup, r.speedup_min, r.speedup_max) for r in conc if r.method == label)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r.concurrency for r in conc}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("requests in flight")
        ax.set_ylabel("tokens/s vs no speculation")
        ax.set_title("Speedup vs concurrency (ShareGPT, greedy)")
        written.append(_save(plt, fig, ax, out_dir / "speedup_vs_concurrency.png"))
    cat = [r for r in rows if r.kind == "category" and r.concurrency == 1 and r.temperature == 0]
    spec_labels = [lbl for lbl in labels[1:] if any(r.method == lbl for r in cat)]
    if cat and spec_labels:
        cats = [c for c in raw["plan"]["categories"] if any(r.workload == c for r in cat)]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / len(spec_labels)
        for i, label in enumerate(spec_labels):
            vals = [next((r.mat for r in cat if r.method == label and r.workload == c), math.nan) for c in cats]
            ax.bar([j + i * width for j in range(len(cats))], vals, width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))])
        ax.set_xticklabels(cats)
        ax.set_ylabel("MAT (tokens per target forward)")
        ax.set_title("Mean accepted tokens per category (batch 1, greedy)")
        written.append(_save(plt, fig, ax, out_dir / "mat_per_category.png"))
    return written


def _save(plt, fig, ax, path: Path) -> str:
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def write_report(raw: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """results.md, results.csv and the PNG plots in ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = build_rows(raw)
    plots = plot(raw, rows, out_dir)
    md = out_dir / "results.md"
    md.write_text(to_markdown(raw, rows, plots))
    csv_path = out_dir / "results.csv"
    csv_path.write_text(to_csv(rows))
    return {"markdown": str(md), "csv": str(csv_path), **{Path(p).stem: p for p in plots}}


def _temperatures(plan: dict) -> str:
    temps = plan.get("temperatures") or [0.0]
    if temps == [0.0]:
        return "greedy"
    return "category temperatures " + ", ".join(f"{t:g}" for t in temps) + " (0 = greedy; sampled requests seeded)"


def _sweep_tokens(plan: dict) -> str:
    sweep = plan.get("sweep_max_tokens")
    return f" (concurrency sweep: {sweep})" if sweep not in (None, plan.get("max_tokens")) else ""
