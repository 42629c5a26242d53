"""Lookahead vs no speculation, side by side in one run (greedy, one request at a time).

    .venv/bin/python benchmarks/side_by_side.py --prompts 32 --max-tokens 256 \
        --config '{"window_size": 7, "ngram_size": 5, "guess_set_size": 7}'

Prompts: the first turn of the Spec-Bench MT-bench questions (../shared/data/specbench),
4 per category, chat-formatted for the bundled SmolLM2-135M-Instruct.  Each engine runs
the same prompts one after the other (batch 1) after one warm-up request; reported:
tokens/s (generated tokens / wall time), MAT = generated tokens / target forwards
(= generated / (generated - accepted drafts), from vLLM's own counters), and whether
every completion equals the no-speculation one.  Only one engine is alive at a time.
This is the seed of the benchmark harness (issue: benchmark harness); it is not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))

from harness import Engine, compare, counter_delta, mean_accepted_tokens, specbench_questions  # noqa: E402

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def prompts_for(model: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    per_cat = max(1, count // len(MT_BENCH))
    rows = [q for cat in MT_BENCH for q in specbench_questions((cat,))[:per_cat]][:count]
    out = []
    for q in rows:
        ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def run(model: str, spec: dict | None, prompts: list[list[int]], max_tokens: int):
    engine = Engine(model, spec, max_model_len=4096)
    try:
        engine.generate(prompts[:1], 16, batch=1)  # warm-up
        before = engine.metrics()
        t0 = time.perf_counter()
        outs = engine.generate(prompts, max_tokens, batch=1, logprobs=2 if spec is None else None)
        wall = time.perf_counter() - t0
        counters = counter_delta(before, engine.metrics())
    finally:
        engine.close()
    tokens = sum(len(o.tokens) for o in outs)
    return outs, tokens / wall, mean_accepted_tokens(counters) if spec else 1.0, wall, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the bundled SmolLM2-135M-Instruct)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--config", action="append", default=[], help="lookahead keys as JSON (repeatable)")
    args = ap.parse_args()
    if args.model is None:
        from vllm_lookahead.models import prepare_default_model

        args.model = str(prepare_default_model())
    configs = [json.loads(c) for c in args.config] or [{}]
    prompts = prompts_for(args.model, args.prompts)

    base, base_tps, _, base_wall, base_tokens = run(args.model, None, prompts, args.max_tokens)
    rows = [("no speculation", base_tps, 1.0, base_wall, base_tokens, "-")]
    for cfg in configs:
        outs, tps, mat, wall, tokens = run(args.model, {"method": "lookahead", **cfg}, prompts, args.max_tokens)
        report, failures = compare(base, outs, json.dumps(cfg))
        for line in report:
            print(line)
        exact = f"{len(prompts) - len(report)}/{len(prompts)} identical, {len(failures)} non-tie diffs"
        rows.append((f"lookahead {json.dumps(cfg) if cfg else '(defaults)'}", tps, mat, wall, tokens, exact))

    print(f"\n{len(prompts)} MT-bench prompts, batch 1, max_tokens {args.max_tokens}, greedy, fp32\n")
    print("| engine | tokens/s | speedup | MAT | wall s | tokens | outputs vs no-spec |")
    print("|---|---|---|---|---|---|---|")
    for name, tps, mat, wall, tokens, exact in rows:
        print(f"| {name} | {tps:.2f} | {tps / base_tps:.2f}x | {mat:.2f} | {wall:.0f} | {tokens} | {exact} |")


if __name__ == "__main__":
    main()
