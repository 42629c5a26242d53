"""``python -m benchmarks.host_work.ab``: two versions of the plugin's host work on one cell, step for step.

    python -m benchmarks.host_work.ab --base HEAD~1 --batch 32 [--context 0] [--temperature 0] [--rounds 3]

The host-work table (``python -m benchmarks.host_work``) measures the plugin as it serves: the
draft rule prices proposing and verifying with the host time it measures, so faster code is spent
on more proposals and a single run's p50 moves with a shared VM's speed.  To tell whether a change
made the same work cheaper, this runs the replay of one cell (:mod:`.lookahead_replay`) with those
prices fixed (:func:`~.lookahead_replay.fix_prices`): both versions then make the same decisions
step by step -- checked: their draft tokens and emitted tokens per step must agree -- and a step's
time compares with the same step's.  Each of ``--rounds`` rounds runs both versions at once, each in
a fresh process, taking their steps in turn (:func:`_runs`); each step keeps its least time over
the rounds (a slow moment of the machine falls out); the report gives both versions' per-step
least times (mean / p50 / p99, each phase's p50) and the median of the per-step ratios.

``--decisions-may-differ``: for a change that moves what is drafted (what the pools hold when, the
rule itself), the versions' steps no longer pair up -- their batches drift apart -- so each
version's runs must still agree among themselves, and the report gives the ratios of the two
versions' p50 and mean over their own steps, with each version's draft and emitted tokens per step.

``--base``: a git revision (checked out into a temporary worktree) or a directory holding a
``vllm_lookahead`` package; the other version is this checkout's.  The replay itself is this
checkout's for both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.engine_env import engine_env

ROOT = Path(__file__).resolve().parents[2]


def _worker(args: argparse.Namespace) -> None:
    """One replay of the cell with ``vllm_lookahead`` imported from ``args.tree``; per-step times
    and decisions into ``args.dump`` (JSON)."""
    tree = Path(args.tree).resolve()
    sys.path.insert(0, str(tree))
    import vllm_lookahead  # from the tree asked for; the replay's own modules stay this checkout's

    if not Path(vllm_lookahead.__file__).resolve().is_relative_to(tree):
        raise SystemExit(f"vllm_lookahead came from {vllm_lookahead.__file__}, not {tree}")
    sys.path.remove(str(tree))
    import torch

    from benchmarks.host_work.__main__ import engine_heap
    from benchmarks.host_work.lookahead_replay import PHASES, LookaheadReplay, StepTimes, fix_prices
    from benchmarks.host_work.served import MAX_NUM_BATCHED_TOKENS
    from benchmarks.host_work.streams import RECORDING, recorded_streams, with_context
    from benchmarks.replay import replay_cost

    served = with_context(recorded_streams(RECORDING), args.context)
    max_model_len = max(len(s.prompt) + len(s.output) for s in served) + 8
    replay = LookaheadReplay(
        served,
        args.batch,
        json.loads(args.config),
        replay_cost(args.cost),
        max_model_len,
        MAX_NUM_BATCHED_TOKENS,
        args.temperature,
        device_time=args.device_time,
    )
    fix_prices(replay)
    torch.manual_seed(0)  # sampled cells: every run draws the same tokens (torch's global stream)
    times = StepTimes()
    turn = os.fdopen(args.turn_fd, "rb", buffering=0)  # a byte from the parent: take a step
    done = os.fdopen(args.done_fd, "wb", buffering=0)  # a byte to the parent: the step is taken
    with engine_heap():
        for k in range(args.warmup + args.steps):
            if not turn.read(1):
                raise SystemExit("the parent left")
            replay.step(times if k >= args.warmup else None)
            done.write(b".")
    Path(args.dump).write_text(
        json.dumps(
            {
                "seconds": {p: times.seconds[p] for p in PHASES},
                "draft_tokens": times.draft_tokens,
                "emitted": times.emitted,
                "stall": times.stall,
            }
        )
    )


def _runs(args: argparse.Namespace, trees: dict[str, Path], out: Path) -> dict[str, list[dict]]:
    """Every version's runs: in each round one fresh process per version, taking their steps in
    turn -- one version's step ``k``, then the other's, the order swapped every step -- so the
    two meet the machine at the same moments (a shared VM's speed moves over seconds) and each
    step finds the caches as the other's step left them, as a forward leaves them on a server."""
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    cell = ["--batch", str(args.batch), "--context", str(args.context), "--temperature", str(args.temperature)]
    cell += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--config", args.config, "--cost", args.cost]
    cell += ["--device-time"] if args.device_time else []
    env, _ = engine_env(os.environ)  # the engines' allocator settings, as the host-work table runs under
    for r in range(args.rounds):
        workers = {}
        for name, tree in trees.items():
            turn_r, turn_w = os.pipe()
            done_r, done_w = os.pipe()
            dump = out / f"{name}-{r}.json"
            command = [sys.executable, "-m", "benchmarks.host_work.ab", "--tree", str(tree), "--dump", str(dump)]
            command += ["--turn-fd", str(turn_r), "--done-fd", str(done_w)]
            log = (out / f"{name}-{r}.log").open("w")
            proc = subprocess.Popen(
                command + cell, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, pass_fds=(turn_r, done_w)
            )
            os.close(turn_r)
            os.close(done_w)
            workers[name] = (proc, turn_w, done_r, dump, log)
        try:
            order = list(workers)
            for k in range(args.warmup + args.steps):
                for name in order if k % 2 == 0 else order[::-1]:
                    _, turn_w, done_r, _, _ = workers[name]
                    try:
                        os.write(turn_w, b".")
                        taken = os.read(done_r, 1)
                    except BrokenPipeError:
                        taken = b""
                    if not taken:
                        raise _failed(name, workers[name])
            for name, (proc, *_, dump, _) in workers.items():
                if proc.wait() != 0:
                    raise _failed(name, workers[name])
                runs[name].append(json.loads(dump.read_text()))
        finally:
            for proc, turn_w, done_r, _, log in workers.values():
                os.close(turn_w)
                os.close(done_r)
                log.close()
                if proc.poll() is None:
                    proc.kill()
    return runs


def _failed(name: str, worker: tuple) -> SystemExit:
    """A worker that stopped: its log's end."""
    proc, *_, log = worker
    proc.wait()
    log.flush()
    return SystemExit(f"{name} failed:\n{Path(log.name).read_text()[-3000:]}")


def compare(runs: dict[str, list[dict]], same_decisions: bool = True) -> dict:
    """The versions' per-step least times, after checking every run made the same decisions (with
    ``same_decisions`` False: every run of a version the same as that version's others)."""
    first = next(iter(runs.values()))[0]
    for name, rs in runs.items():
        own = first if same_decisions else rs[0]
        for r in rs:
            if r["draft_tokens"] != own["draft_tokens"] or r["emitted"] != own["emitted"]:
                whose = "the first run's" if same_decisions else "its other runs'"
                raise SystemExit(f"{name}'s decisions differ from {whose}: its steps do not compare")
    out: dict = {"steps": len(first["emitted"]), "draft_tokens_per_step": float(np.mean(first["draft_tokens"]))}
    least = {}
    for name, rs in runs.items():
        phases = {p: np.min([r["seconds"][p] for r in rs], axis=0) for p in rs[0]["seconds"]}
        # the step's least time over the rounds; the stall (--device-time) is kept whole, not least
        total = np.min([np.sum([r["seconds"][p] for p in r["seconds"]], axis=0) for r in rs], axis=0)
        least[name] = total
        out[name] = {
            "step_ms": {k: float(1e3 * f(total)) for k, f in (("mean", np.mean), ("p50", np.median))}
            | {"p99": float(1e3 * np.percentile(total, 99))},
            "phase_p50_ms": {p: float(1e3 * np.median(v)) for p, v in phases.items()},
            "stall_ms": {
                k: float(1e3 * f(np.concatenate([r["stall"] for r in rs])))
                for k, f in (("p50", np.median), ("p99", lambda a: np.percentile(a, 99)), ("max", np.max))
            }
            if rs[0].get("stall")
            else {},
            "run_p50_ms": [
                round(float(1e3 * np.median(np.sum([r["seconds"][p] for p in r["seconds"]], axis=0))), 3) for r in rs
            ],
            "draft_tokens_per_step": float(np.mean(rs[0]["draft_tokens"])),
            "emitted_per_step": float(np.mean(rs[0]["emitted"])),
        }
    base, head = least.values()
    if same_decisions:
        out["median_step_ratio"] = float(np.median(head / base))
    else:
        out["p50_ratio"] = float(np.median(head) / np.median(base))
        out["mean_ratio"] = float(np.mean(head) / np.mean(base))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.host_work.ab", description=__doc__.splitlines()[0])
    p.add_argument("--base", help="a git revision, or a directory holding a vllm_lookahead package")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=0, help="history tokens before each prompt")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--config", default="{}", help="lookahead's --speculative-config keys (JSON)")
    p.add_argument("--cost", default="h100", help="the draft rule's forward: h100, a100 (rooflines), cpu, or a file")
    p.add_argument(
        "--device-time", action="store_true", help="each step sleeps through its forward as --cost prices it"
    )
    p.add_argument(
        "--decisions-may-differ",
        action="store_true",
        help="the versions draft differently: compare their p50 and mean, not step for step",
    )
    p.add_argument("--tree", help=argparse.SUPPRESS)  # a worker: one run with this tree's vllm_lookahead
    p.add_argument("--dump", help=argparse.SUPPRESS)
    p.add_argument("--turn-fd", type=int, help=argparse.SUPPRESS)  # a worker's pipes to the parent
    p.add_argument("--done-fd", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.tree:
        _worker(args)
        return 0
    if not args.base:
        p.error("--base is required")
    with tempfile.TemporaryDirectory(prefix="host-work-ab-") as tmp:
        base = Path(args.base)
        worktree = None
        if not (base / "vllm_lookahead").is_dir():
            worktree = Path(tmp) / "base"
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(worktree), args.base], cwd=ROOT, check=True)
            base = worktree
        try:
            result = compare(_runs(args, {"base": base, "head": ROOT}, Path(tmp)), not args.decisions_may_differ)
        finally:
            if worktree is not None:
                subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    where = f"batch {args.batch}, context {args.context}, T={args.temperature:g}, {args.rounds} rounds"
    both = "" if args.decisions_may_differ else f", {result['draft_tokens_per_step']:.1f} draft tokens per step (both)"
    print(f"{where}: {result['steps']} steps{both}")
    for name in ("base", "head"):
        r = result[name]
        phases = ", ".join(f"{p} {v:.3f}" for p, v in r["phase_p50_ms"].items())
        print(
            f"{name}: per-step least ms mean {r['step_ms']['mean']:.3f} p50 {r['step_ms']['p50']:.3f} "
            f"p99 {r['step_ms']['p99']:.3f} (phases p50: {phases}); each run's p50 {r['run_p50_ms']}"
            + (f"; stall ms {r['stall_ms']}" if r["stall_ms"] else "")
            + f"; draft / emitted tokens per step {r['draft_tokens_per_step']:.1f} / {r['emitted_per_step']:.2f}"
        )
    if args.decisions_may_differ:
        print(f"head / base: p50 {result['p50_ratio']:.3f}, mean {result['mean_ratio']:.3f}")
    else:
        print(f"head / base, median over steps: {result['median_step_ratio']:.3f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
