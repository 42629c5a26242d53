"""The benchmark plan and its execution: every method over the same workloads.

A *workload* is a fixed list of tokenized prompts run at one concurrency and one
temperature:

* one per prompt category, category concurrency and temperature (``mt_bench``,
  ``code@c4``, ``qa@T0.7``, ``code@c4@T1``: concurrency 1 and temperature 0 are
  left out of the name);
* one per concurrency level of the sweep, on ShareGPT prompts
  (``requests_per_slot x concurrency`` prompts, at least ``min_sweep_requests``),
  greedy.

Sampled workloads (temperature > 0) give every request its own seed, so a method's
completions are reproducible; they are not compared with no speculation token by
token (speculative sampling keeps the distribution, not the realisation).  Their
completions stop at random lengths, so with several requests in flight a method's
tokens/s also depends on which requests happened to stop early (the workload's wall
time is its longest request's): ``ignore_eos`` makes every request generate
``max_tokens`` tokens, so every method does the same work.

No engine sees a prompt twice: every workload and every repeat gets its own
prompts (repeat ``r`` of every method gets the same ones); only a category with
fewer prompts than all repeats need reuses them, in different repeats (fresh
engines), each workload keeping its size (:func:`_short_category_chunks`).
Drafters that learn across requests (vLLM's ``suffix``) would otherwise be
measured copying their own earlier answers.  The warm-up prompt is not in any
workload either.

Repeats are rounds: in round ``r`` every method runs every workload once on the
round's prompts, each method in a fresh engine with identical engine settings
(one engine alive at a time), in listed order on even rounds and reversed on odd
ones, so drift of the machine's speed does not favour a method.  No speculation
is the reference for speedup and exactness (paired round by round).  Raw results
are written as JSON after every engine, so a long run that dies keeps what it measured.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.engine_env import engine_env
from benchmarks.methods import Method, parse_method
from benchmarks.prompts import Prompt, PromptSetError, category_prompts, tokenize

WARMUP_TEXT = "Say hello and name three colours."


@dataclass
class Workload:
    name: str  # "mt_bench", "code@c4@T0.7" or "sharegpt@c16"
    kind: str  # "category" | "concurrency"
    concurrency: int
    prompts: list[list[Prompt]]  # per repeat
    token_ids: list[list[list[int]]]  # per repeat, per prompt
    temperature: float = 0.0
    category: str = ""  # the prompt category (category workloads)

    @property
    def num_requests(self) -> int:
        return sum(len(r) for r in self.token_ids)


def _variant_chunks(pairs: list, sizes: list[int], reps: int) -> list[tuple[list[list[Prompt]], list[list[list[int]]]]]:
    """Per variant, its prompts for every round: fresh ones everywhere, variant by variant."""
    out, cursor = [], 0
    for size in sizes:
        out.append(_split(pairs[cursor : cursor + size * reps], size, reps))
        cursor += size * reps
    return out


def _short_category_chunks(
    pairs: list, sizes: list[int], reps: int, category: str
) -> list[tuple[list[list[Prompt]], list[list[list[int]]]]]:
    """Per variant, its prompts for every round, for a category with fewer prompts than every
    round's variants together need: each variant keeps its size (a variant at concurrency c still
    runs c requests at once), a round's prompts stay distinct (no engine sees one twice) and the
    rounds take their prompts in turn from the category's list, coming round again to its start
    (a round is a fresh engine); with fewer prompts than one round needs, every variant shrinks alike."""
    if len(pairs) < len(sizes):
        raise PromptSetError(
            f"prompt category {category!r} has {len(pairs)} usable prompts, fewer than its "
            f"{len(sizes)} concurrency/temperature variants"
        )
    need = sum(sizes)
    if len(pairs) < need:
        sizes = [max(1, n * len(pairs) // need) for n in sizes]
        need = sum(sizes)
    out: list[tuple[list[list[Prompt]], list[list[list[int]]]]] = [([], []) for _ in sizes]
    for r in range(reps):
        block = [pairs[(r * need + k) % len(pairs)] for k in range(need)]
        cursor = 0
        for (prompts, ids), size in zip(out, sizes):
            prompts.append([p for p, _ in block[cursor : cursor + size]])
            ids.append([t for _, t in block[cursor : cursor + size]])
            cursor += size
    return out


def _split(pairs: list, size: int, repeats: int) -> tuple[list[list[Prompt]], list[list[list[int]]]]:
    chunks = [pairs[r * size : (r + 1) * size] for r in range(repeats)]
    return [[p for p, _ in c] for c in chunks], [[ids for _, ids in c] for c in chunks]


@dataclass
class Plan:
    model: str
    methods: list[str]
    categories: list[str]
    prompts_per_category: int = 6
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16, 32])
    requests_per_slot: int = 2
    min_sweep_requests: int = 8
    max_tokens: int = 128
    sweep_max_tokens: int | None = None  # the concurrency sweep's max_tokens (None: max_tokens)
    repeats: int = 2
    max_prompt_tokens: int = 1536
    max_model_len: int = 2048
    enforce_eager: bool = True
    specbench: str | None = None
    engine_overrides: dict[str, Any] = field(default_factory=dict)
    temperatures: list[float] = field(default_factory=lambda: [0.0])  # category workloads, each its own prompts
    category_concurrency: list[int] = field(default_factory=lambda: [1])  # requests in flight per category
    ignore_eos: bool = False  # every request generates max_tokens (equal work for sampled workloads)
    inherit_malloc: bool = False  # engines keep the caller's malloc settings (else engine_env.FIXED_MALLOC)

    def workload_max_tokens(self, kind: str) -> int:
        if kind == "concurrency" and self.sweep_max_tokens is not None:
            return self.sweep_max_tokens
        return self.max_tokens

    def ordered_methods(self) -> list[Method]:
        methods = [parse_method(m) for m in self.methods]
        refs = [m for m in methods if m.speculative_config is None]
        others = [m for m in methods if m.speculative_config is not None]
        return [refs[0] if refs else parse_method("none"), *others]


def workload_name(category: str, concurrency: int, temperature: float) -> str:
    name = category if concurrency == 1 else f"{category}@c{concurrency}"
    return name if not temperature else f"{name}@T{temperature:g}"


def build_workloads(plan: Plan, tokenizer) -> list[Workload]:
    specbench = Path(plan.specbench) if plan.specbench else None
    per, reps = plan.prompts_per_category, plan.repeats
    variants = [(c, t) for c in plan.category_concurrency for t in plan.temperatures]
    # a variant at concurrency c runs max(per, c) requests per repeat: every slot gets a request
    sizes = [max(per, c) for c, _ in variants]
    workloads: list[Workload] = []
    for cat in plan.categories:
        # every (concurrency, temperature) variant and repeat gets its own prompts
        want = reps * sum(sizes)
        pairs = tokenize(category_prompts(cat, want, specbench), tokenizer, plan.max_prompt_tokens)
        chunks = (
            _variant_chunks(pairs, sizes, reps)
            if len(pairs) >= want
            else _short_category_chunks(pairs, sizes, reps, cat)
        )
        for (conc, temp), (prompts, ids) in zip(variants, chunks):
            workloads.append(Workload(workload_name(cat, conc, temp), "category", conc, prompts, ids, temp, cat))
    if plan.concurrency:
        counts = {c: max(plan.min_sweep_requests, plan.requests_per_slot * c) for c in plan.concurrency}
        need = reps * sum(counts.values())
        pool = tokenize(category_prompts("sharegpt", 2 * need + 16), tokenizer, plan.max_prompt_tokens)
        if len(pool) < need:
            raise RuntimeError(f"only {len(pool)} usable ShareGPT prompts, the sweep needs {need}")
        cursor = 0
        for c in plan.concurrency:
            chunk = pool[cursor : cursor + reps * counts[c]]
            cursor += reps * counts[c]
            prompts, ids = _split(chunk, counts[c], reps)
            workloads.append(Workload(f"sharegpt@c{c}", "concurrency", c, prompts, ids))
    return workloads


@dataclass
class MethodResult:
    method: str  # label
    spec: str
    speculative_config: dict | None
    skip_reason: str | None = None
    engine_start_s: float = 0.0
    # workload name -> list over repeats of RunResult as dicts
    runs: dict[str, list[dict]] = field(default_factory=dict)


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    for mod in ("vllm", "torch"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 -- informational only
            pass
    from vllm_lookahead import __version__

    info["vllm_lookahead"] = __version__
    return info


def round_orders(methods: list[Method], repeats: int) -> list[list[Method]]:
    """The order methods run in, per round (= repeat): as listed, then reversed, alternately.

    A machine's speed drifts and differs from one process to the next by a few
    per cent (measured: the same forward 3-9 % apart in two engines); running every
    method once per round, in alternating order, spreads that over all methods
    instead of handing it to whichever ran last.
    """
    return [list(methods) if r % 2 == 0 else list(reversed(methods)) for r in range(repeats)]


def run_plan(
    plan: Plan,
    out_json: Path,
    progress_factory: Callable[[int], Any] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every method over every workload; returns (and writes) the raw results.

    Repeat ``r`` is round ``r``: every method runs the round's prompts in a fresh
    engine, in the order :func:`round_orders` gives.  Each engine lives in its own process (:mod:`benchmarks.worker`):
    engines in one process share global state (Prometheus registry, patched
    kernels), and vLLM's CPU platform cannot start another engine in a process
    that imported numba (vLLM's ngram drafter does).  The worker's log goes to
    ``logs/r<round>-<n>-<method>.log`` next to the results.
    """
    from transformers import AutoTokenizer

    methods = plan.ordered_methods()
    tokenizer = AutoTokenizer.from_pretrained(plan.model)
    workloads = build_workloads(plan, tokenizer)
    runnable = [m for m in methods if m.skip_reason is None]
    total = len(runnable) * sum(w.num_requests for w in workloads)
    warmup = tokenize([Prompt("warmup", "warmup", WARMUP_TEXT)], tokenizer, plan.max_prompt_tokens)[0][1]
    bar = progress_factory(total) if progress_factory else None
    worker_env, allocator = engine_env(os.environ, plan.inherit_malloc)
    raw: dict[str, Any] = {
        "plan": asdict(plan),
        "environment": {**environment(), "engine_allocator": allocator},
        "workloads": [
            {
                "name": w.name,
                "kind": w.kind,
                "concurrency": w.concurrency,
                "temperature": w.temperature,
                "category": w.category,
                "prompt_ids": [[p.prompt_id for p in rep] for rep in w.prompts],
                "prompt_tokens": [[len(t) for t in rep] for rep in w.token_ids],
            }
            for w in workloads
        ],
        "methods": [],
    }
    logs = out_json.parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, MethodResult] = {}
    for m in methods:
        results[m.label] = MethodResult(m.label, m.spec, m.speculative_config, m.skip_reason)
        raw["methods"].append(results[m.label])
        if m.skip_reason is not None:
            log(f"skipping {m.label}: {m.skip_reason}")
    for rnd, order in enumerate(round_orders(runnable, plan.repeats)):
        for m in order:
            job = {
                "model": plan.model,
                "label": m.label,
                "speculative_config": m.speculative_config,
                "engine": {
                    "max_num_seqs": max([1, *plan.concurrency, *plan.category_concurrency]),
                    "max_model_len": plan.max_model_len,
                    "enforce_eager": plan.enforce_eager,
                    **plan.engine_overrides,
                },
                "warmup": warmup,
                "workloads": [
                    {
                        "name": w.name,
                        "kind": w.kind,
                        "concurrency": w.concurrency,
                        "repeats": [w.token_ids[rnd]],
                        "max_tokens": plan.workload_max_tokens(w.kind),
                        "temperature": w.temperature,
                        "seed": 1_000_003 * rnd,
                        "ignore_eos": plan.ignore_eos,
                    }
                    for w in workloads
                ],
            }
            slug = "".join(ch if ch.isalnum() else "-" for ch in m.label).strip("-")
            outcome = _run_worker(job, logs / f"r{rnd}-{methods.index(m)}-{slug}", bar, worker_env)
            result = results[m.label]
            result.engine_start_s = max(result.engine_start_s, outcome["engine_start_s"])
            for name, runs in outcome["runs"].items():
                result.runs.setdefault(name, []).extend(runs)
            _write(raw, out_json)
    if bar is not None:
        bar.close()
    _write(raw, out_json)
    return json.loads(out_json.read_text())


def _run_worker(job: dict[str, Any], stem: Path, bar: Any, env: dict[str, str] | None = None) -> dict[str, Any]:
    import subprocess
    import sys

    job_path = stem.with_name(stem.name + ".job.json")
    result_path = stem.with_name(stem.name + ".result.json")
    log_path = stem.with_name(stem.name + ".log")
    job_path.write_text(json.dumps(job))
    result_path.unlink(missing_ok=True)
    if bar is not None:
        bar.set_description(f"{job['label']}: starting engine")
    # the worker imports this folder's package wherever the benchmark was started from
    checkout = str(Path(__file__).resolve().parents[1])
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (checkout, base.get("PYTHONPATH", "")) if p)
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", str(job_path), str(result_path)],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            env=base,
        )
        assert proc.stdout is not None
        for line in proc.stdout:  # the worker's protocol: one line per event
            kind, _, arg = line.strip().partition(" ")
            if bar is None:
                continue
            if kind == "@@workload":
                bar.set_description(f"{job['label']} | {arg}")
            elif kind == "@@done":
                bar.update(1)
        rc = proc.wait()
    job_path.unlink(missing_ok=True)
    if rc != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"benchmark worker for {job['label']!r} failed (exit {rc}); log {log_path}:\n{tail}")
    result = json.loads(result_path.read_text())
    result_path.unlink()
    return result


def _write(raw: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    serial = {**raw, "methods": [asdict(m) if isinstance(m, MethodResult) else m for m in raw["methods"]]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(serial))
    tmp.replace(path)
