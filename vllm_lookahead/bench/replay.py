"""Replay a recorded greedy run through drafters, without the model (``bench --replay``).

Greedy output does not depend on the drafts, so a recorded no-speculation run
says exactly what every draft would have had accepted: at each step the draft is
checked against what the model actually said next, with the same tree
verification the engine runs (:func:`~vllm_lookahead.core.greedy_verify`).  That
gives MAT and draft tokens per step of

* lookahead's verification branch: pool candidates as the engine's proposer builds
  them at batch 1 -- with ``max_tokens_per_step: "auto"`` sized by the same draft
  rule (:func:`~vllm_lookahead.core.draft_rule.plan_step`) under a forward-cost
  model (``--replay-cost``: this CPU's profile, or the A100/H100 roofline of
  :mod:`.projection` -- what the rule would choose there), otherwise within a fixed
  per-step budget (``--replay-budget``); the Jacobi window needs the model's
  outputs and is left out;
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
from vllm_lookahead.core.draft_rule import lead_floor, plan_step
from vllm_lookahead.core.step_cost import StepCost
from vllm_lookahead.core.tree import DraftTree


@dataclass
class ReplayResult:
    workload: str
    drafter: str
    tokens: int
    steps: int
    drafted: int
    model_seconds: float = 0.0  # the steps' time under the replay's cost model
    base_seconds: float = 0.0   # the same tokens one per forward under that model

    @property
    def modelled_speedup(self) -> float:
        """Tokens/s over no speculation under the cost model (a model, not a measurement)."""
        return self.base_seconds / self.model_seconds if self.model_seconds else float("nan")

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


def tree_rows(tree: DraftTree) -> int:
    """Draft rows of ``tree`` after its leading chain: the rows the tree pass recomputes."""
    off_chain = np.flatnonzero(tree.parents[1:] != np.arange(tree.size - 1))
    return int(tree.size - 1 - off_chain[0]) if off_chain.size else 0


def replay(prompt: Sequence[int], output: Sequence[int], make: Callable[[list[int]], Any],
           cost: StepCost | None = None) -> tuple[int, int, int, float]:
    """(tokens, forwards, drafted tokens, modelled seconds under ``cost``) of one request.

    ``make(prompt)`` returns a drafter with ``draft(history, room) -> DraftTree``
    and ``learn(history)``.  The first token comes from the prefill forward,
    undrafted, as in the engine; no draft reaches past the recorded output.
    """
    if not output:
        return 0, 0, 0, 0.0
    drafter = make(list(prompt))
    history = [*prompt, output[0]]
    drafter.learn(history)
    i, steps, drafted = 1, 1, 0
    seconds = cost.forward(1) if cost is not None else 0.0
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
        if cost is not None:
            seconds += cost.forward(tree.size, tree_rows(tree))
    return len(output), steps, drafted, seconds


class LookaheadCandidates:
    """Lookahead's verification branch for one request, as the engine builds it at batch 1.

    ``cost``: size each step with the draft rule under this forward-cost model (the
    engine's ``"auto"``); None: candidates within ``budget`` (a fixed cap).  The lead
    candidate's length and the rule's acceptance estimates follow what was accepted, as
    in the engine.
    """

    def __init__(self, config: Any, budget: int | None, prompt: list[int], cost: StepCost | None = None) -> None:
        self.state = RequestLookahead(config, prompt, seed=0)
        self.budget = budget
        self.cost = cost
        self._last: tuple[Any, int] | None = None  # (draft, history length when drafted)

    def draft(self, history: list[int], room: int) -> DraftTree:
        room = max(0, room if self.budget is None else min(room, self.budget))
        recent = history[-self.state.params.lookup_context :]
        floor = lead_floor(self.cost, 1, self.state.params.lead_tokens) if self.cost is not None else 0.0
        cands = self.state.step_candidates(history[-1], recent, room, min_gain=floor)
        if self.cost is not None:
            (plan,) = plan_step([self.state.draft_options(cands, window=False)], self.cost)
            draft = self.state.build(cands, lead=plan.lead, candidates=plan.candidates, window_columns=0, budget=room)
        else:
            draft = self.state.build(cands, candidates=None, window_columns=0, budget=room)
        self._last = (draft, len(history))
        return draft.tree

    def learn(self, history: list[int]) -> None:
        if self._last is not None:
            draft, before = self._last
            new = history[before:]
            self.state.adapt_lead(draft, draft.tree.size, len(new) - 1)
            if draft.tree.size > 1:  # an empty draft is checked by catch_up, as in the engine
                self.state.record_acceptance(draft, draft.tree.size, new, None)
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


def replay_cost(name: str) -> StepCost:
    """The forward-cost model ``--replay-cost`` names: "cpu" (this project's CPU profile),
    "a100"/"h100" (the roofline of bench/projection.py), or a JSON file (``StepCost.to_dict``)."""
    from vllm_lookahead.bench import projection
    from vllm_lookahead.engine.cost_profile import fallback_cost

    if name == "cpu":
        return fallback_cost()
    if name in ("a100", "h100"):
        return projection.step_cost(projection.A100 if name == "a100" else projection.H100)
    return StepCost.from_dict(json.loads(Path(name).read_text()))


def run_replay(
    results_json: Path, methods: list[str], budget: int | None | str = AUTO, max_tokens: int | None = None,
    cost: str = "cpu",
) -> list[ReplayResult]:
    """MAT of each ngram / lookahead method on the recording; ``budget``: draft tokens per
    step for lookahead (None: no limit; "auto": what the config does at batch 1 -- the draft
    rule under ``cost`` (:func:`replay_cost`) for ``max_tokens_per_step: "auto"``, else its cap);
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
            rule = budget == AUTO and config.cost_rule
            b = config.draft_budget(1) if budget == AUTO else budget  # the proposer at batch 1
            model = replay_cost(cost) if rule else None
            label = f"{m.label} (" + (f"draft rule, {cost} cost" if rule else f"budget {b if b is not None else 'none'}") + ")"
            drafters.append((label, lambda prompt, c=config, b=b, model=model: LookaheadCandidates(c, b, prompt, model)))
        else:
            raise ValueError(f"--replay cannot replay {m.label} (ngram and lookahead only)")
    timing = replay_cost(cost)
    results = []
    for workload, pairs in requests.items():
        for label, make in drafters:
            totals = [replay(prompt, output, make, timing) for prompt, output in pairs]
            tokens, steps, drafted, seconds = (sum(t[i] for t in totals) for i in range(4))
            results.append(ReplayResult(workload, label, tokens, steps, drafted, seconds, tokens * timing.forward(1)))
    return results


def to_markdown(results: list[ReplayResult], cost: str = "cpu") -> str:
    lines = [f"| workload | drafter | MAT | draft/step | tokens | modelled speedup ({cost} cost model) |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.workload} | {r.drafter} | {r.mat:.2f} | {r.draft_per_step:.1f} | {r.tokens} | "
                     f"{r.modelled_speedup:.2f}x |")
    return "\n".join(lines)
