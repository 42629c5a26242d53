"""Would more evidence predict lead acceptance better?  Teacher-forced over recorded greedy runs.

At every position of every recorded completion (first 256 tokens) lookahead's lead is built as the
engine builds it, and we record its evidence and how many of its tokens the model accepted.  Then
logistic models of "first token accepted" and "next token accepted, the ones before it were" are
fitted (Newton's method, in-sample log loss) on
  * the draft rule's evidence: context length matched (1 / 2 / >= 3) and ln(support);
  * + ln(match / context): how many tokens before the lead's most recent occurrence in the text
    match the tokens before the root (up to 64; what suffix decoding's match depth measures);
  * + the model's own confidence: the logit of its top probability at the root token and the mean /
    min over the last four tokens (teacher-forced with transformers, same fp32 weights; its argmax
    equals every recorded token).
The first variant's weights are the draft rule's lead-confidence table (``core/fitted.json``:
``draft_rule.LEAD_FIRST_LOGIT``, ``draft_rule.SUPPORT_SLOPE``).  From the repo root (about 2 min):

    .venv/bin/python -m benchmarks.fits.lead_features \
        docs/bench/2026-11-25-confidence-2/results.json docs/bench/ablation-512/results.json
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.replay import recorded_rounds
from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import RequestLookahead

MAX_TOKENS, MATCH_CAP = 256, 64


def accepted(draft, truth):
    n = 0
    while n < len(draft) and n < len(truth) and draft[n] == truth[n]:
        n += 1
    return n


def occurrence_match(text, context, piece):
    """Match length before the most recent earlier occurrence of text[-context:] + piece."""
    a = np.asarray(text)
    n, seq = len(a), np.asarray(list(text[-context:]) + list(piece))
    starts = np.flatnonzero(a[: max(0, n - len(seq) + 1)] == seq[0])
    for j in range(1, len(seq)):
        starts = starts[a[starts + j] == seq[j]]
    starts = starts[starts < n - context]
    if not starts.size:
        return context
    s, m = int(starts[-1]), context
    while m < MATCH_CAP and s - 1 - (m - context) >= 0 and a[s - 1 - (m - context)] == a[n - 1 - m]:
        m += 1
    return m


def logit(p):
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def fit(x, y, iters=50, l2=1e-3):
    w = np.zeros(x.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-x @ w))
        w -= np.linalg.solve((x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(len(w)), x.T @ (p - y) + l2 * w)
    p = np.clip(1 / (1 + np.exp(-x @ w)), 1e-12, 1 - 1e-12)
    return w, float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def records(paths):
    rows = []  # context, support, match, root confidence, mean4, min4, lead length, accepted
    for path in paths:
        raw = json.loads(Path(path).read_text())
        tokenizer = AutoTokenizer.from_pretrained(raw["plan"]["model"])
        model = AutoModelForCausalLM.from_pretrained(raw["plan"]["model"], dtype=torch.float32).eval()
        for workloads in recorded_rounds(raw, tokenizer):
            for prompt, output in (pair for pairs in workloads.values() for pair in pairs):
                output = output[:MAX_TOKENS]
                with torch.no_grad():
                    logits = model(torch.tensor([list(prompt) + list(output)])).logits[0]
                top = torch.softmax(logits[len(prompt) - 1 : len(prompt) + len(output) - 1], -1).max(-1).values.numpy()
                state = RequestLookahead(LookaheadConfig(), prompt, seed=0)
                history = [*prompt, output[0]]
                state.catch_up(history)
                for i in range(1, len(output) - 1):
                    cands = state.step_candidates(history[-1], history[-3:], 32)
                    lead, e = cands.lead, cands.lead_evidence
                    if lead:
                        recent = top[max(0, i - 4) : i]
                        rows.append(
                            (
                                e.context,
                                e.support,
                                occurrence_match(history, e.context, lead[:4]),
                                top[i - 1],
                                recent.mean(),
                                recent.min(),
                                len(lead),
                                accepted(lead, output[i:]),
                            )
                        )
                    history.append(output[i])
                    state.catch_up(history)
    return np.asarray(rows, dtype=float)


def main(*paths):
    r = records(paths)
    ctx, sup, match, root, mean4, min4, length, acc = r.T
    onehot = np.stack([ctx == 1, ctx == 2, ctx >= 3], 1).astype(float)
    base = np.column_stack([onehot, np.log(sup)])
    longer = np.log(match / ctx)[:, None]
    conf = np.column_stack([logit(root), logit(mean4), logit(min4)])
    variants = {
        "rule's evidence (context, support)": base,
        "+ match length": np.column_stack([base, longer]),
        "+ model confidence": np.column_stack([base, conf]),
        "+ both": np.column_stack([base, longer, conf]),
    }
    print(f"{len(r)} leads; first token accepted {np.mean(acc > 0):.3f}")
    # next tokens: token j (2..) is tried when the j-1 before it were accepted
    idx = [(k, j) for k in range(len(r)) for j in range(2, int(min(length[k], acc[k] + 1)) + 1)]
    rows_n, pos = np.array([k for k, _ in idx]), np.array([j for _, j in idx])
    y_next = (pos <= acc[rows_n]).astype(float)
    print("| features | first-token log loss | next-token log loss |\n|---|---|---|")
    for name, x in variants.items():
        _, first = fit(x, (acc > 0).astype(float))
        _, nxt = fit(x[rows_n], y_next)
        print(f"| {name} | {first:.4f} | {nxt:.4f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fits.lead_features", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "recordings", nargs="+", metavar="RESULTS_JSON", help="results.json of recorded greedy runs (docs/bench/...)"
    )
    args = parser.parse_args()
    main(*args.recordings)
