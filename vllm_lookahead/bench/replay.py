"""Replay a recorded greedy run through drafters, without the model (``bench --replay``).

Greedy output does not depend on the drafts, so a recorded no-speculation run
says exactly what every draft would have had accepted: at each step the draft is
checked against what the model actually said next, with the same tree
verification the engine runs (:func:`~vllm_lookahead.core.greedy_verify`).  That
gives MAT and draft tokens per step of

* lookahead's verification branch: pool candidates chosen by
  :meth:`~vllm_lookahead.core.RequestLookahead.propose` within a per-request draft
  budget (``--replay-budget``; by default what CPU "auto" allows one request at
  batch 1: one candidate chain, the lead, growing while accepted, within the
  24-token step cap); the Jacobi window needs the model's outputs and is left out;
* vLLM's ``ngram`` drafter (its own matching function, k=4, lookup 2..4);

in seconds per configuration, for tuning candidate policies before an engine run.
It says nothing about time.  Batch-1 MAT (tokens per target forward) is
reproduced exactly for chain drafts: the engine test (tests/engine/test_bench_cli.py)
checks replay against the engine's own measurement on the toy model, and on the
2026-11-22 512-token run the two agreed to two decimals on every category.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from vllm_lookahead.core import RequestLookahead, greedy_verify
from vllm_lookahead.core.tree import DraftTree


@dataclass
class ReplayResult:
    workload: str
    drafter: str
    tokens: int
    steps: int
    drafted: int

    @property
    def mat(self) -> float:
        return self.tokens / self.steps if self.steps else float("nan")

    @property
    def draft_per_step(self) -> float:
        return self.drafted / self.steps if self.steps else 0.0


def accepted_by(tree: DraftTree, truth: Sequence[int]) -> int:
    """Draft tokens of ``tree`` the target accepts when its greedy continuation is ``truth``."""
    n = tree.size
    argmax = np.full(n, -1, dtype=np.int64)
    on_path = np.zeros(n, dtype=bool)
    on_path[0] = True
    if len(truth):
        argmax[0] = truth[0]
    for v in range(1, n):
        d = int(tree.depths[v])
        if on_path[tree.parents[v]] and d <= len(truth) and int(tree.tokens[v]) == truth[d - 1]:
            on_path[v] = True
            if tree.logits[v] and d < len(truth):
                argmax[v] = truth[d]
    path, _ = greedy_verify(tree, argmax)
    return len(path)


def replay(prompt: Sequence[int], output: Sequence[int], make: Callable[[list[int]], Any]) -> tuple[int, int, int]:
    """(tokens, forwards, drafted tokens) of one request.

    ``make(prompt)`` returns a drafter with ``draft(history, room) -> DraftTree``
    and ``learn(history)``.  The first token comes from the prefill forward,
    undrafted, as in the engine; no draft reaches past the recorded output.
    """
    if not output:
        return 0, 0, 0
    drafter = make(list(prompt))
    history = [*prompt, output[0]]
    drafter.learn(history)
    i, steps, drafted = 1, 1, 0
    while i < len(output):
        room = len(output) - i - 1  # vLLM never drafts past max_tokens
        tree = drafter.draft(history, room)
        accepted = accepted_by(tree, output[i:])
        new = list(output[i : i + accepted + 1])
        history += new
        drafter.learn(history)
        i += len(new)
        steps += 1
        drafted += tree.size - 1
    return len(output), steps, drafted


class LookaheadCandidates:
    """Lookahead's verification branch for one request, as the engine builds it.

    The lead candidate's length adapts to what was accepted, as in the engine
    (:class:`~vllm_lookahead.core.draft_length.DraftLength`).
    """

    def __init__(self, config: Any, budget: int | None, prompt: list[int], max_candidates: int | None = None) -> None:
        self.state = RequestLookahead(config, prompt, seed=0)
        self.budget = budget
        self.max_candidates = max_candidates
        self._last: tuple[Any, int] | None = None  # (draft, history length when drafted)

    def draft(self, history: list[int], room: int) -> DraftTree:
        room = room if self.budget is None else min(room, self.budget)
        recent = history[-self.state.params.lookup_context :]
        draft = self.state.propose(
            history[-1], recent, budget=max(room, 0), window=False, max_candidates=self.max_candidates
        )
        self._last = (draft, len(history))
        return draft.tree

    def learn(self, history: list[int]) -> None:
        if self._last is not None:
            draft, before = self._last
            self.state.adapt_lead(draft, draft.tree.size, len(history) - before - 1)
            self._last = None
        self.state.catch_up(history)


class VllmNgram:
    """vLLM's ngram drafter (k tokens after the longest 2..4-token suffix match)."""

    def __init__(self, k: int = 4, lookup_min: int = 2, lookup_max: int = 4) -> None:
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as find

        self.find, self.k, self.lo, self.hi = find, k, lookup_min, lookup_max

    def __call__(self, prompt: list[int]) -> "VllmNgram":
        return self

    def draft(self, history: list[int], room: int) -> DraftTree:
        from vllm_lookahead.core.tree import TreeBuilder

        tokens = self.find(np.asarray(history, dtype=np.int32), self.lo, self.hi, 1 << 30, min(self.k, room))
        builder = TreeBuilder(history[-1])
        if len(tokens):
            builder.add_chain(0, [int(t) for t in tokens], needs_logits=True)
        return builder.build()

    def learn(self, history: list[int]) -> None:
        pass


def recorded_requests(raw: dict[str, Any], tokenizer: Any) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Workload -> (prompt ids, no-spec output ids) of a ``results.json``, prompts rebuilt from its plan."""
    from vllm_lookahead.bench.suite import Plan, build_workloads

    ref = raw["methods"][0]
    if ref.get("speculative_config") is not None:
        raise ValueError("the first method of a results.json must be no speculation")
    plan = Plan(**{k: v for k, v in raw["plan"].items() if k in Plan.__dataclass_fields__})
    out: dict[str, list[tuple[list[int], list[int]]]] = {}
    for w in build_workloads(plan, tokenizer):
        if w.temperature > 0:
            continue  # sampled completions do not say what a draft would have had accepted
        runs = ref["runs"].get(w.name, [])
        for prompts, run in zip(w.token_ids, runs):
            if len(prompts) != len(run["outputs"]):
                raise ValueError(f"{w.name}: the rebuilt prompts do not match the recorded run")
            out.setdefault(w.name, []).extend(zip(prompts, run["outputs"]))
    return out


AUTO = "auto"


def run_replay(
    results_json: Path, methods: list[str], budget: int | None | str = AUTO, max_tokens: int | None = None
) -> list[ReplayResult]:
    """MAT of each ngram / lookahead method on the recording; ``budget``: draft tokens per
    step for lookahead (None: no limit; "auto": the CPU auto budget of each config at batch 1);
    ``max_tokens``: replay only the first tokens of each completion -- exactly the greedy run
    with that ``max_tokens`` (a greedy completion's prefix does not depend on where it stops)."""
    from transformers import AutoTokenizer

    from vllm_lookahead.bench.methods import parse_method
    from vllm_lookahead.config import LookaheadConfig

    raw = json.loads(Path(results_json).read_text())
    requests = recorded_requests(raw, AutoTokenizer.from_pretrained(raw["plan"]["model"]))
    if max_tokens is not None:
        requests = {w: [(p, o[:max_tokens]) for p, o in pairs] for w, pairs in requests.items()}
    drafters: list[tuple[str, Callable[[list[int]], Any]]] = []
    for spec in methods:
        m = parse_method(spec)
        cfg = m.speculative_config
        if cfg is None:
            continue
        if cfg["method"] == "ngram":
            ngram = VllmNgram(cfg["num_speculative_tokens"], cfg["prompt_lookup_min"], cfg["prompt_lookup_max"])
            drafters.append((m.label, ngram))
        elif cfg["method"] == "lookahead":
            keys = {k: v for k, v in cfg.items() if k != "method"}
            config = LookaheadConfig.model_validate(keys, strict=False)
            b = config.draft_budget("cpu", 1) if budget == AUTO else budget  # the proposer's rule, batch 1
            one = 1 if budget == AUTO and config.chain_only("cpu") else None
            label = f"{m.label} ({'one chain' if one else 'candidates'}, budget {b if b is not None else 'none'})"
            drafters.append((label, lambda prompt, c=config, b=b, one=one: LookaheadCandidates(c, b, prompt, one)))
        else:
            raise ValueError(f"--replay cannot replay {m.label} (ngram and lookahead only)")
    results = []
    for workload, pairs in requests.items():
        for label, make in drafters:
            totals = [replay(prompt, output, make) for prompt, output in pairs]
            results.append(ReplayResult(workload, label, *(sum(t[i] for t in totals) for i in range(3))))
    return results


def to_markdown(results: list[ReplayResult]) -> str:
    lines = ["| workload | drafter | MAT | draft/step | tokens |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.workload} | {r.drafter} | {r.mat:.2f} | {r.draft_per_step:.1f} | {r.tokens} |")
    return "\n".join(lines)
