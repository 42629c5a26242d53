"""Replay a recorded greedy run through drafters, without the model (``bench --replay``).

Greedy output does not depend on the drafts, so a recorded no-speculation run
says exactly what every draft would have had accepted: at each step the draft is
checked against what the model actually said next, with the same tree
verification the engine runs (:func:`~vllm_lookahead.core.greedy_verify`).  That
gives MAT and draft tokens per step of

* lookahead's verification branch: pool candidates as the engine's proposer builds
  them at batch 1 -- with ``max_tokens_per_step: "auto"`` sized by the same draft
  rule (:func:`~vllm_lookahead.core.drafting.draft_step`, the engine's own step) under a forward-cost
  model (``--replay-cost``: this CPU's profile, the recording's own step times
  (:func:`measured_cost`), or the A100/H100 roofline of :mod:`.projection` --
  what the rule would choose there), otherwise within a fixed
  per-step budget (``--replay-budget``); the Jacobi window needs the model's
  outputs and is left out;
* vLLM's ``ngram`` drafter (its own matching function, k=4, lookup 2..4);
* vLLM's ``suffix`` drafter (ArcticInference's suffix tree, as vLLM's proposer
  calls it; its cache of earlier responses lives as long as an engine: one per
  repeat of the recording; needs ``arctic-inference``);

in seconds per configuration, for tuning candidate policies before an engine run;
time only as modelled: every step's draft priced by the cost model (``ReplayResult.
modelled_speedup``), a model, not a measurement.  Batch-1 MAT (tokens per target forward) is
reproduced exactly for chain drafts: the engine test (tests/engine/test_bench_cli.py)
checks replay against the engine's own measurement on the toy model, and on the
2026-11-22 512-token run the two agreed to two decimals on every category (suffix:
within 0.01 of the engine's on every category of the 2026-11-25 run).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vllm_lookahead.core import RequestLookahead, greedy_verify
from vllm_lookahead.core.draft_rule import lead_floor
from vllm_lookahead.core.drafting import DraftRequest, draft_step
from vllm_lookahead.core.pool import SharedPools
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
    base_seconds: float = 0.0  # the same tokens one per forward under that model

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


def replay(
    prompt: Sequence[int], output: Sequence[int], make: Callable[[list[int]], Any], cost: StepCost | None = None
) -> tuple[int, int, int, float]:
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
    in the engine.  ``shared``: the engine's pools of every request's output (``shared_pool``).
    """

    def __init__(
        self,
        config: Any,
        budget: int | None,
        prompt: list[int],
        cost: StepCost | None = None,
        shared: SharedPools | None = None,
    ) -> None:
        self.state = RequestLookahead(config, prompt, seed=0, shared=shared)
        self.budget = budget
        self.cost = cost
        self._last: tuple[Any, int] | None = None  # (draft, history length when drafted)

    def draft(self, history: list[int], room: int) -> DraftTree:
        room = max(0, room if self.budget is None else min(room, self.budget))
        recent = history[-self.state.config.lookup_context :]
        floor = lead_floor(self.cost, 1, self.state.config.lead_tokens) if self.cost is not None else 0.0
        cands = self.state.step_candidates(history[-1], recent, room, min_gain=floor)
        (draft,) = draft_step([DraftRequest(self.state, cands, room, window=False)], self.cost)
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

    def __call__(self, prompt: list[int]) -> VllmNgram:
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


class SuffixDecoding:
    """vLLM's suffix decoding drafter (:class:`vllm.v1.spec_decode.suffix_decoding.SuffixDecodingProposer`'s
    calls into ArcticInference's ``SuffixDecodingCache``, Oliaro et al. 2024) with vLLM's defaults:
    one cache per engine, requests replayed one after another (batch 1), each finished request's
    response kept for the next."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
        from vllm.config import SpeculativeConfig

        defaults = {
            f: SpeculativeConfig.__dataclass_fields__[f].default
            for f in SpeculativeConfig.__dataclass_fields__
            if f.startswith("suffix_decoding_")
        }
        opt = {**defaults, **{k: v for k, v in cfg.items() if k.startswith("suffix_decoding_")}}
        self.depth = int(opt["suffix_decoding_max_tree_depth"])
        self.k = int(cfg.get("num_speculative_tokens") or self.depth)
        self.factor = float(opt["suffix_decoding_max_spec_factor"])
        self.min_prob = float(opt["suffix_decoding_min_token_prob"])
        self.cache = SuffixDecodingCache(
            max_tree_depth=self.depth, max_cached_requests=int(opt["suffix_decoding_max_cached_requests"])
        )
        self._requests = 0
        self._seen = 0  # tokens of the active request's history already added to the cache

    def __call__(self, prompt: list[int]) -> SuffixDecoding:
        for req in list(self.cache.active_requests):
            self.cache.stop_request(req)
        self._requests += 1
        self.cache.start_request(str(self._requests), np.asarray(prompt, dtype=np.int32))
        self._seen = len(prompt)
        return self

    def draft(self, history: list[int], room: int) -> DraftTree:
        from vllm_lookahead.core.tree import TreeBuilder

        pattern = np.asarray(history[max(0, len(history) - self.depth) :], dtype=np.int32)
        spec = self.cache.speculate(
            str(self._requests),
            pattern,
            max_spec_tokens=min(self.k, room),
            max_spec_factor=self.factor,
            min_token_prob=self.min_prob,
        )
        builder = TreeBuilder(history[-1])
        if spec.token_ids:
            builder.add_chain(0, [int(t) for t in spec.token_ids], needs_logits=True)
        return builder.build()

    def learn(self, history: list[int]) -> None:
        if len(history) > self._seen:
            self.cache.add_active_response(str(self._requests), history[self._seen :])
            self._seen = len(history)


def recorded_rounds(raw: dict[str, Any], tokenizer: Any) -> list[dict[str, list[tuple[list[int], list[int]]]]]:
    """Per repeat of a ``results.json`` (one engine each, in the order it ran its workloads):
    workload -> (prompt ids, no-spec output ids), prompts rebuilt from its plan."""
    from benchmarks.suite import Plan, build_workloads

    ref = raw["methods"][0]
    if ref.get("speculative_config") is not None:
        raise ValueError("the first method of a results.json must be no speculation")
    plan = Plan(**{k: v for k, v in raw["plan"].items() if k in Plan.__dataclass_fields__})
    rounds: list[dict[str, list[tuple[list[int], list[int]]]]] = []
    for w in build_workloads(plan, tokenizer):
        if w.temperature > 0:
            continue  # sampled completions do not say what a draft would have had accepted
        for r, (prompts, run) in enumerate(zip(w.token_ids, ref["runs"].get(w.name, []))):
            if len(prompts) != len(run["outputs"]):
                raise ValueError(f"{w.name}: the rebuilt prompts do not match the recorded run")
            while len(rounds) <= r:
                rounds.append({})
            rounds[r][w.name] = list(zip(prompts, run["outputs"]))
    return rounds


AUTO = "auto"


def _lookahead_engine(
    config: Any, budget: int | None, cost: StepCost | None
) -> Callable[[list[int]], LookaheadCandidates]:
    """One engine's lookahead drafter: a request's state per prompt, the engine's shared pools
    (``shared_pool``) across them."""
    shared = SharedPools.for_config(config) if config.shared_pool else None
    return lambda prompt: LookaheadCandidates(config, budget, prompt, cost, shared)


def replay_cost(name: str, raw: dict[str, Any] | None = None) -> StepCost:
    """The forward-cost model ``--replay-cost`` names: "cpu" (this project's CPU profile),
    "measured" (the recording ``raw``'s own step times, :func:`measured_cost`), "a100"/"h100"
    (the roofline of benchmarks/projection.py), or a JSON file (``StepCost.to_dict``)."""
    from benchmarks import projection
    from vllm_lookahead.engine.propose.cost_profile import fallback_cost

    if name == "cpu":
        return fallback_cost()
    if name == "measured":
        if raw is None:
            raise ValueError("--replay-cost measured needs the recording")
        return measured_cost(raw)
    if name in ("a100", "h100"):
        return projection.step_cost(projection.A100 if name == "a100" else projection.H100)
    return StepCost.from_dict(json.loads(Path(name).read_text()))


def measured_cost(raw: dict[str, Any], min_calls: int = 10) -> StepCost:
    """What a forward of each size cost in the recording ``raw`` (a ``results.json``): the engine's
    step time (``execute_model``, the bench's ``forward<T>`` timers) per number of tokens T in the
    batch-1 workloads, for each size the cheapest method's mean over at least ``min_calls`` steps
    (a branching tree only adds its tree pass to a chain of the same size; with no chain method at
    a size, the trees' time stands for it); tree rows at the bundled profile's price.  Unlike the
    start-up profile (dummy forwards) it holds what real steps add: attention over real contexts,
    input preparation, the rows' logits -- on the 2026-11-25 runs of this CPU a draft token cost
    ~1.5 ms of real step where the profile, scaled to the same 1-token time, says ~1.2.  It models
    the machine and the methods that recorded it: a recording with chain methods (suffix, ngram,
    lookahead's defaults) at batch 1."""
    from benchmarks.report import forward_shapes
    from vllm_lookahead.engine.propose.cost_profile import FALLBACK

    concurrency = {w["name"]: w["concurrency"] for w in raw["workloads"]}
    best: dict[int, float] = {}
    for method in raw["methods"]:
        runs = [run for name, rs in method.get("runs", {}).items() if concurrency.get(name) == 1 for run in rs]
        for n, (calls, seconds) in forward_shapes(runs).items():
            if calls >= min_calls:
                best[n] = min(best.get(n, float("inf")), seconds / calls)
    if not best:
        raise ValueError("the recording has no per-size step timers at batch 1 (bench runs since 2026-11-25 have)")
    points = sorted(best.items())
    return StepCost(tuple(n for n, _ in points), tuple(s for _, s in points), tree_row_prior=FALLBACK.tree_row_prior)


def run_replay(
    results_json: Path,
    methods: list[str],
    budget: int | None | str = AUTO,
    max_tokens: int | None = None,
    cost: str = "cpu",
) -> list[ReplayResult]:
    """MAT of each ngram / lookahead method on the recording; ``budget``: draft tokens per
    step for lookahead (None: no limit; "auto": what the config does at batch 1 -- the draft
    rule under ``cost`` (:func:`replay_cost`) for ``max_tokens_per_step: "auto"``, else its cap);
    ``max_tokens``: replay only the first tokens of each completion -- exactly the greedy run
    with that ``max_tokens`` (a greedy completion's prefix does not depend on where it stops)."""
    from transformers import AutoTokenizer

    from benchmarks.methods import lookahead_config, parse_method
    from vllm_lookahead.config import DraftMode

    raw = json.loads(Path(results_json).read_text())
    rounds = recorded_rounds(raw, AutoTokenizer.from_pretrained(raw["plan"]["model"]))
    if max_tokens is not None:
        rounds = [{w: [(p, o[:max_tokens]) for p, o in pairs] for w, pairs in r.items()} for r in rounds]
    timing = replay_cost(cost, raw)  # prices every replayed step; the replayed draft rule plans with it too
    drafters: list[tuple[str, Callable[[], Callable[[list[int]], Any]]]] = []  # label, a new engine's drafter
    for spec in methods:
        m = parse_method(spec)
        cfg = m.speculative_config
        if cfg is None:
            continue
        if cfg["method"] == "ngram":
            ngram = VllmNgram(cfg["num_speculative_tokens"], cfg["prompt_lookup_min"], cfg["prompt_lookup_max"])
            drafters.append((m.label, lambda ngram=ngram: ngram))
        elif cfg["method"] == "suffix":
            drafters.append((m.label, lambda cfg=cfg: SuffixDecoding(cfg)))  # its cache lives as long as an engine
        elif cfg["method"] == "lookahead":
            config = lookahead_config(cfg)
            rule = budget == AUTO and config.mode is DraftMode.AUTO
            b = config.draft_budget(1) if budget == AUTO else budget  # the proposer at batch 1
            model = timing if rule else None
            label = (
                f"{m.label} ("
                + (f"draft rule, {cost} cost" if rule else f"budget {b if b is not None else 'none'}")
                + ")"
            )
            drafters.append((label, lambda c=config, b=b, model=model: _lookahead_engine(c, b, model)))
        else:
            raise ValueError(f"--replay cannot replay {m.label} (ngram, suffix and lookahead only)")
    totals: dict[tuple[str, str], list[float]] = {}  # (workload, drafter) -> tokens, steps, drafted, seconds
    for label, engine in drafters:
        for workloads in rounds:  # each repeat on a new engine, its workloads in order (as the benchmark runs)
            make = engine()
            for workload, pairs in workloads.items():
                t = totals.setdefault((workload, label), [0, 0, 0, 0.0])
                for prompt, output in pairs:
                    for i, v in enumerate(replay(prompt, output, make, timing)):
                        t[i] += v
    workload_order = list(dict.fromkeys(w for r in rounds for w in r))
    return [
        ReplayResult(w, label, *map(int, t[:3]), t[3], t[0] * timing.forward(1))
        for w in workload_order
        for label, _ in drafters
        if (t := totals.get((w, label)))
    ]


def to_markdown(results: list[ReplayResult], cost: str = "cpu") -> str:
    lines = [
        f"| workload | drafter | MAT | draft/step | tokens | modelled speedup ({cost} cost model) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.workload} | {r.drafter} | {r.mat:.2f} | {r.draft_per_step:.1f} | {r.tokens} | "
            f"{r.modelled_speedup:.2f}x |"
        )
    return "\n".join(lines)
