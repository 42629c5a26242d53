"""``python -m benchmarks.serving [ARGS]``: see :mod:`benchmarks.serving`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from benchmarks.methods import parse_method
from benchmarks.serving.plan import Plan, run_plan
from benchmarks.serving.report import write_report
from benchmarks.serving.workloads import WORKLOADS

PROG = "python -m benchmarks.serving"
DEFAULT_METHODS = ["none", "ngram", "suffix", "lookahead", 'lookahead:{"max_tokens_per_step": 1}']
KV_CACHE_GIB = "4"  # VLLM_CPU_KVCACHE_SPACE of every server unless set: 32 long requests fit


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        allow_abbrev=False,
        description="Serve each method (a fresh `vllm-lookahead serve` per method and round, identical settings) and "
        "drive it with vLLM's `vllm bench serve`: Poisson rates at fractions of no speculation's saturation, a bursty "
        "point and a saturated queue; TTFT, TPOT, ITL, end-to-end latency, throughput and goodput as ratios against "
        "no speculation, with their spread over rounds; outputs compared.  Writes results.{json,md,csv} and "
        "latency_vs_rate.png to --out.",
    )
    p.add_argument("--model", default=None, help="model folder (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument(
        "--methods",
        nargs="+",
        default=DEFAULT_METHODS,
        metavar="SPEC",
        help="none | ngram[:JSON] | suffix[:JSON] | lookahead[:JSON]; the first must be none (default: %(default)s)",
    )
    p.add_argument("--workloads", nargs="+", default=["chat", "code", "summarization"], choices=list(WORKLOADS))
    p.add_argument(
        "--temperatures",
        nargs="+",
        type=float,
        default=[0.0, 0.7],
        help="0: greedy at natural lengths; > 0: seeded, ignore_eos (default: %(default)s)",
    )
    p.add_argument("--rounds", type=int, default=3, help="servers per method; the order is reversed every other round")
    p.add_argument("--requests", type=int, default=32, help="requests per Poisson point (default: %(default)s)")
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=32,
        help="the servers' --max-num-seqs; the saturated point keeps "
        "that many in flight and as many queued (default: %(default)s)",
    )
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--load-fractions",
        nargs="+",
        type=float,
        default=[0.25, 0.5, 0.8],
        help="Poisson rates as fractions of no speculation's saturation (default: %(default)s)",
    )
    p.add_argument("--bursty-fraction", type=float, default=0.5)
    p.add_argument("--burstiness", type=float, default=0.5, help="gamma shape of the bursty point (1: Poisson)")
    p.add_argument(
        "--goodput",
        nargs="*",
        default=[],
        metavar="METRIC:MS",
        help="the SLO of goodput, as vLLM takes it (e.g. ttft:2000 tpot:100)",
    )
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument for every server (repeat; e.g. --serve-arg=--max-model-len --serve-arg=4096)",
    )
    p.add_argument("--inherit-malloc", action="store_true", help="servers keep this environment's malloc settings")
    p.add_argument("--out", default="serving-results")
    p.add_argument("--report-only", metavar="RESULTS_JSON", default=None, help="rebuild the report of a results.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.out)
    if args.report_only:
        paths = write_report(json.loads(Path(args.report_only).read_text()), out)
        print(Path(paths["markdown"]).read_text())
        return 0
    try:
        for spec in args.methods:
            parse_method(spec)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    model = args.model
    if model is None:
        from vllm_lookahead.models import prepare_default_model

        model = str(prepare_default_model())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    # a terminated benchmark stops the server it runs (its finally clauses run on SystemExit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    plan = Plan(
        model=model,
        served_model=Path(model).name,
        out=out,
        methods=args.methods,
        workloads=args.workloads,
        temperatures=args.temperatures,
        rounds=args.rounds,
        requests=args.requests,
        max_num_seqs=args.max_num_seqs,
        max_tokens=args.max_tokens,
        load_fractions=args.load_fractions,
        bursty_fraction=args.bursty_fraction,
        burstiness=args.burstiness,
        serve_args=args.serve_arg,
        goodput=args.goodput,
        inherit_malloc=args.inherit_malloc,
    )
    try:
        raw = run_plan(plan, log=lambda line: print(line, file=sys.stderr, flush=True))
    except (RuntimeError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    paths = write_report(raw, out)
    print(Path(paths["markdown"]).read_text())
    print("written: " + ", ".join(paths.values()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
