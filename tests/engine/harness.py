"""Run prompts through a vLLM engine with and without lookahead and compare token by token."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
from dataclasses import dataclass, field

from benchmarks.counters import counter_delta, engine_metrics, mean_accepted_tokens  # noqa: F401 (re-exported to the tests)
from benchmarks.engine_env import in_process_start
from benchmarks.methods import engine_arguments
from benchmarks.prompts import SPECBENCH_FILE as SPECBENCH  # shipped with the package

# Two fp32 kernels (vLLM's CPU attention vs the tree path's SDPA) may round
# differently; a differing token is only tolerated where the no-speculation run's
# top-two logits are this close (|logprob1 - logprob2| == |logit1 - logit2|).
TIE_TOLERANCE = 1e-4

ENGINE_DEFAULTS = dict(
    dtype="float32",
    enforce_eager=True,
    gpu_memory_utilization=0.3,
    max_model_len=2048,
    max_num_seqs=8,
    block_size=32,  # small blocks: requests that share a prompt share its cached KV
    seed=0,
    disable_log_stats=False,
    max_logprobs=-1,  # requests may ask for the whole vocabulary (logprobs=-1)
)

# Thinking markers of every test engine's reasoning config (tokenized by each model's tokenizer).
THINK_START, THINK_END = "<think>", "</think>"

# The toy engine with branching trees that several test files share (engines fixture); its leads
# grow to 8 tokens (the toy model loops, so a lead of 32 would make every full tree ~50 tokens).
TOY_TREE = {
    "method": "lookahead",
    "window_size": 3,
    "ngram_size": 4,
    "guess_set_size": 5,
    "max_lead_tokens": 8,
    "max_tokens_per_step": 0,
}
# The bundled model's engine with branching trees (test_real_exactness.py, test_sampling_stats.py):
# candidates merged where they share a first token, plus a 2 x 2 window, no per-step cap.
REAL_TREE = {
    "method": "lookahead",
    "window_size": 2,
    "ngram_size": 3,
    "guess_set_size": 2,
    "max_lead_tokens": 0,
    "max_tokens_per_step": 0,
}


def specbench_questions(categories: tuple[str, ...] | None = None, limit: int | None = None) -> list[dict]:
    rows = [json.loads(line) for line in SPECBENCH.read_text().splitlines() if line.strip()]
    if categories:
        rows = [r for r in rows if r["category"] in categories]
    return rows[:limit] if limit else rows


@dataclass
class Completion:
    tokens: list[int]
    gaps: list[float] = field(default_factory=list)  # top1 - top2 logprob per token (baseline only)
    logprobs: list[float] = field(default_factory=list)  # logprob of each returned token (if asked)
    prompt_logprobs: list[float | None] = field(default_factory=list)  # per prompt token (if asked)


@contextlib.contextmanager
def _threads_for(model: str):
    """The bundled model's engines compute on every core of this process (its steps ran 1.3-1.4x
    faster so on the 2-core CI machine than under vLLM's default, which binds an engine's threads to
    one core and leaves the other to the rest); the toy model's steps are too small to gain, and
    keep vLLM's default.  A binding the caller chose (``VLLM_CPU_OMP_THREADS_BIND``) stays."""
    key = "VLLM_CPU_OMP_THREADS_BIND"
    if "toy" in os.path.basename(model.rstrip("/")) or os.environ.get(key):
        yield
        return
    cores = sorted(os.sched_getaffinity(0))
    os.environ[key] = ",".join(map(str, cores))
    try:
        yield
    finally:
        del os.environ[key]


class Engine:
    """One vLLM engine (``LLM``); close() frees it so the next one fits in memory.

    The engine core and its worker run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
    an engine starts in ~2 s instead of ~35 s (vLLM's CPU platform spawns the engine core and
    its worker, and each spawned process imports vLLM again), and a test can patch plugin code
    the engine runs.  Tensor-parallel workers are still processes of their own.  One engine
    lives at a time: in-process engines share the process's distributed state (vLLM's shutdown
    of one tears down the groups of all), so a new engine closes the live one first.
    """

    _live: Engine | None = None

    def __init__(self, model: str, speculative_config: dict | None = None, **overrides):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        if Engine._live is not None:
            Engine._live.close()

        kwargs = {**ENGINE_DEFAULTS, **overrides}
        if "reasoning_config" not in kwargs:
            # Every engine knows thinking markers (a fresh config per engine: it caches the
            # model's token ids), so requests may carry a thinking_token_budget; requests
            # without one are untouched by it.
            from vllm.config.reasoning import ReasoningConfig

            kwargs["reasoning_config"] = ReasoningConfig(reasoning_start_str=THINK_START, reasoning_end_str=THINK_END)
        # a spec's ablation keys (merge_candidates, ...) travel in additional_config, as the benchmark sends them
        kwargs.update(engine_arguments(speculative_config))
        with _in_process(), _threads_for(model):
            self.llm = LLM(model=model, **kwargs)
        self.spec = speculative_config
        Engine._live = self

    @property
    def closed(self) -> bool:
        return not hasattr(self, "llm")

    def tokenizer(self):
        return self.llm.get_tokenizer()

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        batch: int,
        logprobs: int | None = None,
        per_prompt: tuple[dict, ...] | None = None,
        **params,
    ) -> list[Completion]:
        """Greedy completions; ``per_prompt[i]`` (cycled) adds sampling params to prompt i."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        base = {"temperature": 0.0, "max_tokens": max_tokens, "logprobs": logprobs, **params}
        sps = [
            SamplingParams(**{**base, **(per_prompt[i % len(per_prompt)] if per_prompt else {})})
            for i in range(len(prompts))
        ]
        out: list[Completion] = []
        for i in range(0, len(prompts), batch):
            chunk = [TokensPrompt(prompt_token_ids=p) for p in prompts[i : i + batch]]
            for res in self.llm.generate(chunk, sps[i : i + batch], use_tqdm=False):
                o = res.outputs[0]
                gaps, chosen = [], []
                for token, lp in zip(o.token_ids, o.logprobs or []):
                    vals = sorted((v.logprob for v in lp.values()), reverse=True)
                    gaps.append(vals[0] - vals[1] if len(vals) > 1 else math.inf)
                    chosen.append(lp[token].logprob)
                prompt_lps = [
                    None if lp is None else lp[t].logprob
                    for t, lp in zip(res.prompt_token_ids, res.prompt_logprobs or [])
                ]
                out.append(Completion(list(o.token_ids), gaps, chosen, prompt_lps))
        return out

    def metrics(self) -> dict[str, float]:
        return engine_metrics(self.llm)

    def close(self) -> None:
        if self.closed:
            return
        if Engine._live is self:
            Engine._live = None
        try:
            self.llm.llm_engine.engine_core.shutdown()
        finally:
            del self.llm
            gc.collect()


@contextlib.contextmanager
def _in_process():
    import vllm.envs as envs

    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    cached = envs._is_envs_cache_enabled()
    if cached:
        envs.disable_envs_cache()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        with in_process_start():  # the unit tests before the engines load numba
            yield
    finally:
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old
        if cached:
            envs.enable_envs_cache()


def compare(baseline: list[Completion], candidate: list[Completion], label: str) -> tuple[list[str], list[str]]:
    """(report lines, failures): every differing token is reported with the baseline's top-two gap."""
    report, failures = [], []
    for i, (b, c) in enumerate(zip(baseline, candidate, strict=True)):
        if b.tokens == c.tokens:
            continue
        j = next((k for k, (x, y) in enumerate(zip(b.tokens, c.tokens)) if x != y), min(len(b.tokens), len(c.tokens)))
        gap = b.gaps[j] if j < len(b.gaps) else math.nan
        line = (
            f"{label} prompt {i}: first difference at token {j}: baseline {b.tokens[j : j + 1]} vs lookahead "
            f"{c.tokens[j : j + 1]}, baseline top1-top2 logit gap {gap:.3g}"
        )
        report.append(line)
        if not (gap <= TIE_TOLERANCE):
            failures.append(line)
    return report, failures


def real_prompt(model: str) -> list[int]:
    """Mid-repetition inside the assistant turn: the model copies the sentence on."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    text = "The quick brown fox jumps over the lazy dog near the river bank."
    for pad in range(64):  # 32k + 1 tokens: requests share k cached blocks and compute one token
        messages = [
            {"role": "user", "content": f"Repeat this sentence five times{'!' * pad}: {text}"},
            {"role": "assistant", "content": " ".join([text] * 3) + " The quick brown fox"},
        ]
        ids = tok.apply_chat_template(messages, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        end = len(ids) - 1 - ids[::-1].index(tok.convert_tokens_to_ids("<|im_end|>"))
        if end % 32 == 1:
            return ids[:end]
    raise AssertionError("no padding gives a prompt of 32k + 1 tokens")


def readme_python_block(first_line: str) -> str:
    """The README's ```python block whose first line is ``first_line`` (a comment naming it)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"README has {len(found)} python blocks starting with {first_line!r}"
    return found[0]
