"""Teacher-forced comparison of vLLM's suffix drafter and lookahead's lead at every position.

Both drafters are fed the recorded (no-speculation, greedy) text; at each position we ask both for
a draft and count where each drafts, how many tokens each would have had accepted, and who is right
when their first tokens differ.  Usage (from the repo root, with the `suffix` extra installed):

    .venv/bin/python docs/bench/2026-11-25-shared/suffix_vs_lead.py \
        docs/bench/2026-11-25-confidence-2/results.json math_reasoning,code
"""

import collections
import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from vllm_lookahead.bench.replay import SuffixDecoding, recorded_rounds
from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import RequestLookahead


def prefix(draft, truth):
    n = 0
    while n < len(draft) and n < len(truth) and draft[n] == truth[n]:
        n += 1
    return n


def main(results_json: str, categories: str, max_tokens: int = 256) -> None:
    raw = json.loads(Path(results_json).read_text())
    rounds = recorded_rounds(raw, AutoTokenizer.from_pretrained(raw["plan"]["model"]))
    cfg = LookaheadConfig()
    for cat in categories.split(","):
        st = collections.Counter()
        for workloads in rounds:
            engine = SuffixDecoding({"method": "suffix"})  # one cache per engine, as the benchmark runs
            for workload, pairs in workloads.items():
                for prompt, output in pairs:
                    output = output[:max_tokens]
                    suffix = engine(list(prompt))
                    ours = RequestLookahead(cfg, prompt, seed=0)
                    history = [*prompt, output[0]]
                    suffix.learn(history)
                    ours.catch_up(history)
                    for i in range(1, len(output) - 1):
                        if workload == cat:
                            truth = output[i:]
                            sd = [int(t) for t in suffix.draft(history, len(output) - i - 1).tokens[1:]]
                            ld = list(ours.step_candidates(history[-1], history[-3:], len(output) - i - 1).lead)
                            a_s, a_l = prefix(sd, truth), prefix(ld, truth)
                            st["positions"] += 1
                            st["suffix drafts"] += bool(sd)
                            st["lead drafts"] += bool(ld)
                            st["suffix accepted"] += a_s
                            st["lead accepted (whole lead)"] += a_l
                            if sd and not ld:
                                st["only suffix drafts"] += 1
                                st["  its accepted"] += a_s
                            if sd and ld and sd[0] != ld[0]:
                                st["first tokens differ"] += 1
                                st["  suffix right"] += a_s > 0
                                st["  lead right"] += a_l > 0
                        history.append(output[i])
                        suffix.learn(history)
                        ours.catch_up(history)
        print(cat, dict(st))


if __name__ == "__main__":
    main(*sys.argv[1:])
