"""How often a lead's tokens are accepted, by where it was found: the request's own text or the
shared pool (other requests' outputs), by matched context k and first-token support.

Teacher-forced over recorded greedy runs (one shared pool per engine = per repeat), every position:
first-token acceptance seen vs the draft rule's model (LeadConfidence without per-request
calibration), and next-token acceptance given the tokens before it were right: the evidence of
the shared-pool tables of ``core/fitted.json`` (``draft_rule.SHARED_*``).  From the repo root:

    .venv/bin/python -m benchmarks.fits.shared_lead_evidence \
        docs/bench/2026-11-25-confidence-2/results.json docs/bench/ablation-512/results.json
"""

import argparse
import collections
import json
from pathlib import Path

from transformers import AutoTokenizer

from benchmarks.replay import recorded_rounds
from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import RequestLookahead
from vllm_lookahead.core.draft_rule import LeadConfidence
from vllm_lookahead.core.pool import SharedPools
from vllm_lookahead.core.source import Source


def main(*recordings: str, max_tokens: int = 256) -> None:
    cfg = LookaheadConfig(shared_pool=True)
    model = LeadConfidence()
    first = collections.defaultdict(lambda: [0, 0, 0.0])  # (kind, k, support<=3) -> n, hits, predicted
    nexts = collections.defaultdict(lambda: [0, 0])  # (kind, k) -> tries, hits
    for rec in recordings:
        raw = json.loads(Path(rec).read_text())
        for workloads in recorded_rounds(raw, AutoTokenizer.from_pretrained(raw["plan"]["model"])):
            shared = SharedPools.for_config(cfg)
            for pairs in workloads.values():
                for prompt, output in pairs:
                    output = output[:max_tokens]
                    state = RequestLookahead(cfg, prompt, seed=0, shared=shared)
                    history = [*prompt, output[0]]
                    state.catch_up(history)
                    for i in range(1, len(output) - 1):
                        c = state.step_candidates(history[-1], history[-3:], len(output) - i - 1)
                        if c.lead:
                            e = c.lead_evidence
                            kind = "shared" if c.lead_sources[0] == int(Source.SHARED) else "own"
                            truth = output[i:]
                            f = first[(kind, e.context, min(e.support, 3))]
                            f[0] += 1
                            f[1] += c.lead[0] == truth[0]
                            f[2] += model.first(e)
                            for j in range(1, min(len(c.lead), len(truth))):
                                if c.lead[j - 1] != truth[j - 1]:
                                    break
                                nexts[(kind, e.context)][0] += 1
                                nexts[(kind, e.context)][1] += c.lead[j] == truth[j]
                        history.append(output[i])
                        state.catch_up(history)
    for key in sorted(first):
        n, hits, predicted = first[key]
        print("first", key, n, f"seen {hits / n:.2f}  model {predicted / n:.2f}")
    for key in sorted(nexts):
        n, hits = nexts[key]
        print("next ", key, n, f"seen {hits / n:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fits.shared_lead_evidence", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "recordings", nargs="+", metavar="RESULTS_JSON", help="results.json of recorded greedy runs (docs/bench/...)"
    )
    args = parser.parse_args()
    main(*args.recordings)
