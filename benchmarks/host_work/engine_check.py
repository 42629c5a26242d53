"""``python -m benchmarks.host_work.engine_check``: the plugin's host work as a running engine's own
timers read it, beside the host-work replay of the same requests.

    python -m benchmarks.host_work.engine_check --out docs/bench/DATE-host-work-engine

Serves ``--in-flight`` prompts of the recording (:mod:`.streams`) greedily through an in-process
vLLM engine on this machine, all at once -- the bundled model, lookahead with ``--config``, vLLM's
H100 budget of 8,192 tokens per step -- and keeps, step by step, what the plugin's own timers
measured: the step's report (``propose_seconds``, ``verify_seconds``: what ``vllm:lookahead_propose_seconds`` and
``vllm:lookahead_verify_seconds`` export) and, timed here, its ``_prepare_inputs`` hook (the tree
batch).  Then the engine's own completions are replayed (:mod:`.lookahead_replay`) at the same batch
size with the same config, ``--rounds`` times, from the same first step (every prompt admitted
whole) for ``--steps`` steps: with a stand-in for the engine's forward where each step's forward
goes (:func:`forward_stand_in`), as the engine's timers run after one, and again with the steps
back to back.  Only steps whose batch is full are compared
(at least 90 % of the requests decoding; the tree batch and verification: those of them that
carried trees).  One wave: with more prompts than slots (``--requests``) the engine drops every
draft on a step that can admit all waiting requests
(:mod:`vllm_lookahead.engine.propose.admission`, a scheduler's policy the replay does not model) and
its steps' work no longer matches the replay's.  ``agrees``: the engine's per-step p50 lies within
the replay's per-step p10-p90 (pooled over its rounds; the replay with the stand-in).

Greedy only: the replay knows every tree node's target token from the engine's completions.  The
engine's verification time includes vLLM's sampler over the roots and the argmax over the logits,
which the replay reads off the completions instead: its ``verify`` is not the same work, and is
reported, not compared.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmarks.host_work.served import MAX_NUM_BATCHED_TOKENS
from benchmarks.host_work.streams import RECORDING, Stream, recorded_streams

FULL = 0.9  # a step counts as a full batch with at least this share of --in-flight requests decoding
COMPARED = ("propose", "tree batch")  # the same work in the engine and in the replay
WITH_TREES = ("tree batch", "verify")  # read over the steps that carried trees only


def _record_steps(steps: list[dict[str, float]]) -> Callable[[], None]:
    """Keep each engine step's plugin timers in ``steps`` (the runner's hooks wrapped, this
    process's in-process engine); returns what puts the hooks back."""
    from vllm_lookahead.engine.runner import RunnerLookahead

    propose, prepare, take = RunnerLookahead.propose, RunnerLookahead.on_prepare_inputs, RunnerLookahead.take_report
    step: dict[str, float] = {}

    def proposing(self, sampled_token_ids, *args, **kwargs):
        step["decoding"] = sum(1 for s in sampled_token_ids if s)
        return propose(self, sampled_token_ids, *args, **kwargs)

    def preparing(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return prepare(self, *args, **kwargs)
        finally:
            step["tree batch"] = time.perf_counter() - t
            step["trees"] = float(self.batch is not None)

    def taking(self):
        report = self.report
        steps.append(
            {
                "decoding": step.pop("decoding", 0),
                "propose": report.propose_seconds,
                "verify": report.verify_seconds,
                "tree batch": step.pop("tree batch", 0.0),
                "trees": step.pop("trees", 0.0),
            }
        )
        return take(self)

    RunnerLookahead.propose, RunnerLookahead.on_prepare_inputs, RunnerLookahead.take_report = (
        proposing,
        preparing,
        taking,
    )

    def restore() -> None:
        RunnerLookahead.propose, RunnerLookahead.on_prepare_inputs, RunnerLookahead.take_report = propose, prepare, take

    return restore


def serve(args: argparse.Namespace, prompts: list[list[int]]) -> tuple[list[Stream], list[dict[str, float]]]:
    """The engine's completions of ``prompts`` and its steps' plugin timers."""
    from benchmarks.driver import BenchEngine
    from vllm_lookahead.models import prepare_default_model

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    steps: list[dict[str, float]] = []
    restore = _record_steps(steps)
    try:
        engine = BenchEngine(
            str(prepare_default_model()),
            {"method": "lookahead", **json.loads(args.config)},
            max_num_seqs=args.in_flight,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            max_model_len=2048,
        )
        try:
            result = engine.run(prompts, args.in_flight, args.max_tokens)
        finally:
            engine.close()
    finally:
        restore()
    streams = [Stream(tuple(p), tuple(o)) for p, o in zip(prompts, result.outputs) if len(o) >= 2]
    return streams, steps


def forward_stand_in(weight_bytes: int, rows: int) -> Callable[[], None]:
    """A stand-in for the engine's forward on this CPU, run by the replay where each step's forward
    goes: ``rows`` (the requests in flight) times a bf16 matrix the size of the model's weights, on
    torch's threads as the forward's matmuls.  What it leaves behind for the plugin's work after it
    (the caches refilled with weights) is what the engine's plugin timers run in; the replay's
    steps back to back read ~1.3x less (``docs/results.md``)."""
    import torch

    k = max(int((weight_bytes / 2) ** 0.5), 1)
    weights = torch.ones((k, k), dtype=torch.bfloat16)
    x = torch.ones((rows, k), dtype=torch.bfloat16)
    return lambda: torch.mm(x, weights)


def replay(
    args: argparse.Namespace, streams: list[Stream], between: Callable[[], None] | None = None
) -> list[list[dict[str, float]]]:
    """Each round's measured steps of the replay of ``streams`` (phase seconds and requests
    decoding); ``between``: run where each step's forward goes."""
    from benchmarks.host_work.__main__ import engine_heap
    from benchmarks.host_work.lookahead_replay import PHASES, LookaheadReplay, StepTimes
    from benchmarks.replay import replay_cost

    max_model_len = max(len(s.prompt) + len(s.output) for s in streams) + 8
    rounds = []
    for _ in range(args.rounds):
        cell = LookaheadReplay(streams, args.in_flight, json.loads(args.config), replay_cost("h100"), max_model_len)
        cell.between = between
        times = StepTimes()
        with engine_heap():
            for _ in range(args.warmup):
                cell.step(None)
            for _ in range(args.steps):
                cell.step(times)
        rounds.append(
            [
                {
                    "decoding": times.decoding[i],
                    "trees": float(times.draft_tokens[i] > 0),
                    **{p: times.seconds[p][i] for p in PHASES},
                }
                for i in range(len(times.decoding))
            ]
        )
    return rounds


def _weight_bytes() -> int:
    from vllm_lookahead.models import prepare_default_model

    return sum(f.stat().st_size for f in prepare_default_model().glob("*.safetensors"))


def _full(steps: list[dict[str, float]], in_flight: int, trees: bool = False) -> list[dict[str, float]]:
    """The full-batch steps (``trees``: of those, the ones that carried trees)."""
    return [s for s in steps if s["decoding"] >= FULL * in_flight and (s["trees"] or not trees)]


def _ms(values: list[float]) -> dict[str, float]:
    a = 1e3 * np.asarray(values, dtype=np.float64)
    if not len(a):
        return {}
    return {k: float(np.percentile(a, q)) for k, q in (("p10", 10), ("p50", 50), ("p90", 90), ("p99", 99))} | {
        "mean": float(a.mean())
    }


def compare(engine_steps: list[dict[str, float]], rounds: list[list[dict[str, float]]], in_flight: int) -> dict:
    """Per phase: the engine's and the replay's per-step ms over full-batch steps (the tree batch
    and verification: those that carried trees), each replay round's p50, and whether the engine's
    p50 lies within the replay's p10-p90."""
    out: dict = {
        "engine_steps": len(_full(engine_steps, in_flight)),
        "engine_steps_with_trees": len(_full(engine_steps, in_flight, trees=True)),
        "replay_steps": [len(_full(r, in_flight)) for r in rounds],
        "phases": {},
    }
    for phase in (*COMPARED, "verify"):
        trees = phase in WITH_TREES
        replay_full = [_full(r, in_flight, trees) for r in rounds]
        engine = _ms([s[phase] for s in _full(engine_steps, in_flight, trees)])
        replayed = _ms([s[phase] for r in replay_full for s in r])
        entry = {
            "engine_ms": engine,
            "replay_ms": replayed,
            "replay_round_p50_ms": [_ms([s[phase] for s in r]).get("p50") for r in replay_full],
        }
        if phase in COMPARED and engine and replayed:
            entry["agrees"] = replayed["p10"] <= engine["p50"] <= replayed["p90"]
        out["phases"][phase] = entry
    return out


def _table(c: dict) -> list[str]:
    def cell(d: dict) -> str:
        return " / ".join(f"{d[k]:.3f}" for k in ("mean", "p50", "p10", "p90", "p99")) if d else "-"

    lines = [
        "| phase | engine (its own timers) | replay (rounds pooled) | replay rounds' p50 | agrees |",
        "|---|---|---|---|---|",
    ]
    for phase, e in c["phases"].items():
        rounds = ", ".join(f"{v:.3f}" for v in e["replay_round_p50_ms"] if v is not None)
        agrees = {True: "yes", False: "no"}.get(e.get("agrees"), "not compared")
        lines.append(f"| {phase} | {cell(e['engine_ms'])} | {cell(e['replay_ms'])} | {rounds} | {agrees} |")
    return lines


def _markdown(result: dict) -> str:
    c = result["comparison"]
    lines = [
        f"# The plugin's host work: the engine's own timers beside the replay ({result['date']})",
        "",
        f"Machine: {result['machine']}.  Command: `{result['command']}`.  {c['engine_steps']} full-batch engine "
        f"steps, {c['engine_steps_with_trees']} of them with trees; replay rounds of {result['steps']} measured "
        f"steps after {result['warmup']} ({', '.join(map(str, c['replay_steps']))} of them full-batch).",
        "",
        "ms per step, mean / p50 / p10 / p90 / p99, full-batch steps only (tree batch and verify: those "
        "that carried trees); `agrees`: the engine's p50 within the replay's p10-p90.  The replay runs a stand-in "
        "for the engine's forward where each step's forward goes (`forward_stand_in`: the batch times a bf16 "
        "matrix the size of the model's weights)",
        "",
    ]
    lines += _table(c)
    lines += [
        "",
        "The same replay with its steps back to back (no stand-in for the forward between them):",
        "",
        *_table(result["back_to_back"]),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    import sys

    from benchmarks.host_work.__main__ import _cores
    from benchmarks.suite import environment

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--in-flight", type=int, default=256, help="requests in flight (max_num_seqs; the replay's batch)")
    p.add_argument("--requests", type=int, help="prompts served (the recording's, cycled; default: --in-flight)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument(
        "--config",
        default='{"max_tokens_per_step": 1024}',
        help="lookahead's --speculative-config keys (JSON); the default drafts for every request "
        "(a fixed cap: the draft rule on this CPU drafts nothing at 256 in flight)",
    )
    p.add_argument("--rounds", type=int, default=3, help="replay rounds")
    p.add_argument("--steps", type=int, default=40, help="measured replay steps per round")
    p.add_argument(
        "--warmup", type=int, default=1, help="replay steps before measuring (the first admits every prompt)"
    )
    p.add_argument("--recording", type=Path, default=RECORDING)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    recorded = recorded_streams(args.recording)
    prompts = [list(recorded[i % len(recorded)].prompt) for i in range(args.requests or args.in_flight)]
    streams, engine_steps = serve(args, prompts)
    rounds = replay(args, streams, forward_stand_in(_weight_bytes(), args.in_flight))
    back_to_back = replay(args, streams)
    env = environment()
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{env.get('cpu', env['machine'])}, {_cores()} cores",
        "environment": env,
        "command": "python -m benchmarks.host_work.engine_check " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": json.loads(args.config),
        "in_flight": args.in_flight,
        "steps": args.steps,
        "warmup": args.warmup,
        "engine_steps": engine_steps,
        "comparison": compare(engine_steps, rounds, args.in_flight),
        "back_to_back": compare(engine_steps, back_to_back, args.in_flight),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    (args.out / "results.md").write_text(_markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()
