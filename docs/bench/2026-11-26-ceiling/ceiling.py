"""How far a better draft *length* could take lookahead at batch 1 on this CPU: clairvoyant cuts.

Replays a recorded greedy run (as ``bench --replay`` does) with drafters that know the future: each
step drafts exactly the prefix of a candidate that the model will accept -- no draft token is ever
wasted, none that would have been accepted is left out.  The candidates are lookahead's lead (the
whole lead, grown to 32 tokens), vLLM's suffix drafter's draft, or the longer accepted prefix of
the two.  Their modelled tokens/s is the ceiling of any rule that decides *how much* of those
candidates to draft; the real drafters (suffix at vLLM's defaults, lookahead's draft rule) are
replayed beside them.  Every time is the replay's cost model (``cpu``: the start-up profile;
``measured``: the recording's own step time per forward size), a model, not a measurement.

Needs the ``suffix`` extra (arctic-inference).  From the repo root:

    .venv/bin/python docs/bench/2026-11-26-ceiling/ceiling.py \
        docs/bench/2026-11-25-confidence-2/results.json measured
"""

import collections
import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from vllm_lookahead.bench.replay import (
    LookaheadCandidates, SuffixDecoding, recorded_rounds, replay, replay_cost,
)
from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import RequestLookahead
from vllm_lookahead.core.tree import TreeBuilder


def accepted_prefix(draft, truth):
    n = 0
    while n < len(draft) and n < len(truth) and draft[n] == truth[n]:
        n += 1
    return list(draft[:n])


class Clairvoyant:
    """Drafts the accepted prefix of the lead ("lead"), of suffix's draft ("suffix"), or the longer."""

    def __init__(self, which: str, suffix: SuffixDecoding, output: list) -> None:
        self.which, self.suffix_engine, self.output = which, suffix, output

    def __call__(self, prompt):
        self.lead = RequestLookahead(LookaheadConfig(), prompt, seed=0)
        self.suffix = self.suffix_engine(prompt)
        self.prompt_len = len(prompt)
        return self

    def draft(self, history, room):
        truth = self.output[0][len(history) - self.prompt_len:]
        best = []
        if self.which in ("lead", "both"):
            lead = self.lead.step_candidates(history[-1], history[-3:], room).lead
            best = accepted_prefix(lead, truth)
        if self.which in ("suffix", "both"):
            tokens = [int(t) for t in self.suffix.draft(history, room).tokens[1:]]
            best = max(best, accepted_prefix(tokens, truth), key=len)
        builder = TreeBuilder(history[-1])
        if best:
            builder.add_chain(0, best, needs_logits=True)
        return builder.build()

    def learn(self, history):
        self.lead.catch_up(history)
        self.suffix.learn(history)


def main(results_json: str, cost_name: str = "measured", max_tokens: int = 256) -> None:
    raw = json.loads(Path(results_json).read_text())
    rounds = recorded_rounds(raw, AutoTokenizer.from_pretrained(raw["plan"]["model"]))
    cost = replay_cost(cost_name, raw)
    drafters = ["suffix (vLLM defaults)", "lookahead (draft rule)", "clairvoyant lead", "clairvoyant suffix",
                "clairvoyant best of both"]
    totals = collections.defaultdict(lambda: [0, 0, 0.0])  # (workload, drafter) -> tokens, steps, seconds
    for name in drafters:
        for workloads in rounds:  # one engine per repeat, workloads in order, as the benchmark ran them
            suffix = SuffixDecoding({"method": "suffix"})
            current = [None]
            if name.startswith("suffix"):
                make = suffix
            elif name.startswith("lookahead"):
                config = LookaheadConfig()
                make = lambda prompt, c=config: LookaheadCandidates(c, None, prompt, cost)  # noqa: E731
            else:
                make = Clairvoyant({"lead": "lead", "suffix": "suffix", "best": "both"}[name.split()[1]], suffix, current)
            for workload, pairs in workloads.items():
                if "@" in workload:
                    continue  # batch 1 only
                for prompt, output in pairs:
                    output = output[:max_tokens]
                    current[0] = output
                    tokens, steps, _, seconds = replay(prompt, output, make, cost)
                    t = totals[(workload, name)]
                    t[0] += tokens
                    t[1] += steps
                    t[2] += seconds
    base = cost.forward(1)
    print(f"cost model: {cost_name}; modelled tokens/s over no speculation, and / suffix's\n")
    print("| category | " + " | ".join(drafters) + " |")
    print("|---|" + "---|" * len(drafters))
    for workload in dict.fromkeys(w for w, _ in totals):
        speed = {d: totals[(workload, d)][0] * base / totals[(workload, d)][2] for d in drafters}
        ref = speed[drafters[0]]
        cells = [f"MAT {totals[(workload, d)][0] / totals[(workload, d)][1]:.2f}, {speed[d]:.2f}x ({speed[d] / ref:.2f})"
                 for d in drafters]
        print(f"| {workload} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
