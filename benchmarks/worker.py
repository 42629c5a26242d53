"""One method's engine, run in its own process by :func:`benchmarks.suite.run_plan`.

    python -m benchmarks.worker JOB.json RESULT.json

Reads the job (model, speculative config, engine arguments, a warm-up prompt,
workloads as token ids per repeat, max_tokens), warms the engine up, runs every
workload once per repeat (each repeat on its own prompts) and writes ``{"engine_start_s", "runs": {workload:
[RunResult, ...]}}``.
Progress goes to stdout, one line per event (``@@workload NAME``, ``@@done``);
vLLM's own log goes to stderr.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path


def _say(*parts: str) -> None:
    print(*parts, flush=True)


def run_job(job: dict) -> dict:
    from benchmarks.driver import BenchEngine

    t0 = time.perf_counter()
    engine = BenchEngine(job["model"], job["speculative_config"], **job["engine"])
    start_s = time.perf_counter() - t0
    runs: dict[str, list[dict]] = {}
    try:
        workloads = job["workloads"]
        _warm_up(engine, job["warmup"], int(job["engine"]["max_num_seqs"]))
        for w in workloads:
            _say("@@workload", w["name"])
            for prompts in w["repeats"]:
                run = engine.run(
                    prompts,
                    int(w["concurrency"]),
                    int(w["max_tokens"]),
                    on_finish=lambda: _say("@@done"),
                    temperature=float(w.get("temperature", 0.0)),
                    seed=int(w.get("seed", 0)),
                    ignore_eos=bool(w.get("ignore_eos", False)),
                )
                runs.setdefault(w["name"], []).append(asdict(run))
    finally:
        engine.close()
    return {"engine_start_s": start_s, "runs": runs}


def _warm_up(engine, prompt: list[int], max_c: int) -> None:
    """One short request, then the largest batch the sweep will run (a prompt no workload uses)."""
    engine.run([prompt], 1, 16)
    if max_c > 1:
        engine.run([prompt] * max_c, max_c, 8)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text())
    result = run_job(job)
    tmp = Path(args[1]).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
