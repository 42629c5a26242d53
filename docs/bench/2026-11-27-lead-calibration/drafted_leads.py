"""Drafted leads against the draft rule's expectation, in one engine process.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python drafted_leads.py CONCURRENCY TEMPERATURE CATEGORY [ROUNDS]

Runs CONCURRENCY prompts of CATEGORY (the bench's prompt sets) at once, 128 tokens each, on the
bundled model with lookahead's defaults, ROUNDS times (default 2) in the same engine, and prints
per round: the leads the rule drafted (``plans``), the expected accepted tokens it credited them
with when it chose them (``expected``, first tokens apart), the tokens of those leads accepted
(``accepted``), per lead position how many were tried and accepted, and the wall time.  The rule's
expectation is read from the options and plans of ``core.drafting``'s call of ``plan_step``; the
outcomes from ``engine.verify_step``.  Nothing in the engine is changed.
"""

import collections
import json
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from vllm_lookahead.bench.prompts import category_prompts, tokenize  # noqa: E402
from vllm_lookahead.core import drafting  # noqa: E402
from vllm_lookahead.engine import runner, verify_step  # noqa: E402
from vllm_lookahead.models import prepare_default_model  # noqa: E402

count: collections.Counter = collections.Counter()
plan_step, verify = drafting.plan_step, verify_step.verify_step


def counted_plan(options, cost, **kwargs):
    plans = plan_step(options, cost, **kwargs)
    for o, p in zip(options, plans):
        if o is not None and p.lead > 0:
            count["plans"] += 1
            count["expected_first"] += o.lead_gains[0]
            count["expected"] += sum(o.lead_gains[: p.lead])
    return plans


def counted_verify(run, logits, batch):
    out, outcomes = verify(run, logits, batch)
    for o in outcomes.values():
        if o.draft is None or o.draft.lead_tokens == 0:
            continue
        accepted = 0
        for depth, node in enumerate(o.path.tolist(), start=1):
            if node != depth or depth > o.draft.lead_tokens:
                break
            accepted += 1
        count["accepted"] += accepted
        count["accepted_first"] += int(accepted > 0)
        for k in range(1, min(accepted + 1, o.draft.lead_tokens) + 1):
            count[f"tried_{k}"] += 1
            count[f"hit_{k}"] += int(k <= accepted)
    return out, outcomes


drafting.plan_step = counted_plan
runner.verify_step = counted_verify

if __name__ == "__main__":
    concurrency, temperature, category = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    llm = LLM(model=str(prepare_default_model()), enforce_eager=True, max_model_len=2048, max_num_seqs=concurrency,
              speculative_config={"method": "lookahead"})
    prompts = [ids for _, ids in tokenize(category_prompts(category, concurrency), llm.get_tokenizer(), 1536)]
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=128, ignore_eos=True) for i in range(len(prompts))]
    for r in range(rounds):
        count.clear()
        t0 = time.time()
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        wall = time.time() - t0
        positions = {k: f"{count[f'hit_{k}']}/{count[f'tried_{k}']}" for k in range(1, 9) if count[f"tried_{k}"]}
        print(json.dumps({"round": r + 1, "wall_s": round(wall, 2), "plans": count["plans"],
                          "expected": round(count["expected"], 1), "accepted": count["accepted"],
                          "expected_first": round(count["expected_first"], 1), "accepted_first": count["accepted_first"],
                          "accepted/tried by position": positions}), flush=True)
