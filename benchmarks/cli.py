"""``python -m benchmarks``: the side-by-side benchmark (run from the repository root).

python -m benchmarks                       # every default method, bundled model
python -m benchmarks --methods none ngram 'lookahead:{"window_size":4}' --concurrency 1 4
python -m benchmarks --report-only bench-results/results.json
python -m benchmarks --replay bench-results/results.json --methods ngram lookahead
python -m benchmarks --project bench-results/results.json --project-cost gpu/cost_b1.json gpu/cost_b16.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.methods import DEFAULT_METHODS

PROG = "python -m benchmarks"
DEFAULT_CATEGORIES = ("mt_bench", "code", "summarization", "qa", "math_reasoning")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        metavar="SPEC",
        help="none | ngram[:JSON] | suffix[:JSON] | lookahead[:JSON] (default: %(default)s); "
        "no speculation always runs first as the reference",
    )
    p.add_argument(
        "--categories",
        nargs="*",
        default=list(DEFAULT_CATEGORIES),
        help="batch-1 prompt categories (default: %(default)s); the flag alone skips them",
    )
    p.add_argument("--prompts-per-category", type=int, default=6)
    p.add_argument(
        "--temperatures",
        nargs="+",
        type=float,
        default=[0.0],
        help="temperatures of the category workloads (default: %(default)s = greedy); each gets its "
        "own prompts; sampled requests are seeded",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="every request generates --max-tokens tokens (vLLM's ignore_eos): sampled workloads "
        "with several requests in flight then compare equal work",
    )
    p.add_argument(
        "--inherit-malloc",
        action="store_true",
        help="engines keep this environment's malloc settings (default: glibc's thresholds fixed "
        "for every engine, unless LD_PRELOAD, MALLOC_* or GLIBC_TUNABLES are set; see "
        "benchmarks/engine_env.py)",
    )
    p.add_argument(
        "--category-concurrency",
        nargs="+",
        type=int,
        default=[1],
        help="requests in flight for the category workloads (default: %(default)s); a workload at "
        "concurrency c runs max(--prompts-per-category, c) requests per repeat",
    )
    p.add_argument(
        "--concurrency",
        nargs="*",
        type=int,
        default=[1, 4, 16, 32],
        help="requests in flight for the ShareGPT sweep (default: %(default)s); the flag alone skips it",
    )
    p.add_argument(
        "--requests-per-slot",
        type=int,
        default=2,
        help="sweep requests = max(--min-sweep-requests, this x concurrency)",
    )
    p.add_argument("--min-sweep-requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--sweep-max-tokens", type=int, default=None, help="max_tokens of the concurrency sweep (default: --max-tokens)"
    )
    p.add_argument("--repeats", type=int, default=2, help="runs of every workload per method (speedup spread)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-prompt-tokens", type=int, default=1536, help="longer prompts are dropped, not cut")
    p.add_argument("--no-eager", action="store_true", help="let vLLM compile (default: eager, as served on CPU)")
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="extra vLLM engine argument for every method, e.g. --engine-arg dtype='\"bfloat16\"'",
    )
    p.add_argument(
        "--specbench", default=None, help="Spec-Bench questions.jsonl (default: the copy shipped with the package)"
    )
    p.add_argument("--out", default="bench-results", help="output folder (default: %(default)s)")
    p.add_argument(
        "--report-only",
        metavar="RESULTS_JSON",
        default=None,
        help="only rebuild tables and plots from an earlier results.json",
    )
    p.add_argument(
        "--replay",
        metavar="RESULTS_JSON",
        default=None,
        help="no engine: replay the no-spec outputs of an earlier results.json through the "
        "ngram, suffix and lookahead --methods (lookahead: candidates only, no window) and print "
        "the MAT each would reach and a speedup modelled by --replay-cost (benchmarks/replay.py)",
    )
    p.add_argument(
        "--project",
        metavar="RESULTS_JSON",
        default=None,
        help="no engine: project the batch-1 MAT and draft sizes of an earlier results.json onto "
        "A100/H100 with a 7B bf16 model under a roofline cost model (a model, not a measurement; "
        "benchmarks/projection.py)",
    )
    p.add_argument(
        "--project-cost",
        nargs="+",
        metavar="COST_JSON",
        default=None,
        help="with --project: price forwards with costs measured on a GPU instead of the roofline, "
        "one column per file (cost_b<B>.json of python -m benchmarks.gpu.check, or any "
        "StepCost JSON)",
    )
    p.add_argument(
        "--replay-budget",
        type=int,
        default=None,
        help="draft tokens per step for replayed lookahead (default: what the config does at "
        "batch 1 -- the draft rule for max_tokens_per_step 'auto'; -1 = no limit)",
    )
    p.add_argument(
        "--replay-cost",
        default="cpu",
        help="forward-cost model of the replayed draft rule: cpu (this project's CPU profile), "
        "measured (the recording's own step time per forward size, at batch 1), "
        "a100 or h100 (the projection's roofline: what the rule would choose there), or a JSON "
        "file as the engine logs it (default: cpu)",
    )
    p.add_argument(
        "--replay-max-tokens",
        type=int,
        default=None,
        help="replay only the first N tokens of every recorded completion: exactly the "
        "greedy run with max_tokens N (default: all)",
    )


def _engine_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{PROG}: --engine-arg wants KEY=JSON, got {item!r}")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


def run(args: argparse.Namespace) -> int:
    from benchmarks.report import write_report

    out_dir = Path(args.out)
    if args.replay:
        from benchmarks.replay import run_replay
        from benchmarks.replay import to_markdown as replay_markdown

        budget = "auto" if args.replay_budget is None else None if args.replay_budget < 0 else args.replay_budget
        try:
            results = run_replay(Path(args.replay), args.methods, budget, args.replay_max_tokens, args.replay_cost)
        except ValueError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 2
        print(replay_markdown(results, args.replay_cost))
        return 0
    if args.project:
        from benchmarks.projection import project, project_measured

        if args.project_cost:
            print(project_measured(Path(args.project), [Path(f) for f in args.project_cost]))
        else:
            print(project(Path(args.project)))
        return 0
    if args.report_only:
        raw = json.loads(Path(args.report_only).read_text())
        paths = write_report(raw, out_dir)
        print(Path(paths["markdown"]).read_text())
        return 0

    from benchmarks.methods import parse_method
    from benchmarks.prompts import PromptSetError
    from benchmarks.suite import Plan, run_plan

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
    plan = Plan(
        model=model,
        methods=args.methods,
        categories=args.categories,
        prompts_per_category=args.prompts_per_category,
        concurrency=sorted(set(args.concurrency)),
        requests_per_slot=args.requests_per_slot,
        min_sweep_requests=args.min_sweep_requests,
        max_tokens=args.max_tokens,
        sweep_max_tokens=args.sweep_max_tokens,
        repeats=args.repeats,
        max_prompt_tokens=args.max_prompt_tokens,
        max_model_len=args.max_model_len,
        enforce_eager=not args.no_eager,
        specbench=args.specbench,
        engine_overrides=_engine_overrides(args.engine_arg),
        temperatures=args.temperatures,
        category_concurrency=sorted(set(args.category_concurrency)),
        ignore_eos=args.ignore_eos,
        inherit_malloc=args.inherit_malloc,
    )

    def progress(total: int):
        from tqdm import tqdm

        return tqdm(total=total, unit="req", dynamic_ncols=True, file=sys.stderr)

    try:
        raw = run_plan(plan, out_dir / "results.json", progress)
    except PromptSetError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a worker failed; its log tail is in the message
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    paths = write_report(raw, out_dir)
    print(Path(paths["markdown"]).read_text())
    print("written: " + ", ".join(paths.values()), file=sys.stderr)
    return 0


DESCRIPTION = (
    "Benchmark no speculation, vLLM ngram/suffix and lookahead side by side: the same prompts with the "
    "same engine settings through every method (one engine at a time, each in its own worker process, one "
    "round per repeat), greedy: one workload per prompt category at batch 1 and a ShareGPT concurrency "
    "sweep. Writes results.json, results.md, results.csv and PNG plots to --out."
)


def main(argv: list[str] | None = None) -> int:
    # no abbreviations: `--requests` must not silently mean `--requests-per-slot`
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, allow_abbrev=False)
    add_arguments(parser)
    return run(parser.parse_args(argv))
