"""Where a tree step's time goes: in-process engine, bundled model, batch 1 (2026-11-25).

Times (perf_counter around the functions) vLLM's CPU attention kernel, lookahead's tree pass,
the LM head, verification and propose, per engine step, over 6 prompts (mt_bench, code,
summarization; 2 each) x 256 greedy tokens.  Usage, from the repo root:

    .venv/bin/python docs/bench/2026-11-25-attention/step_profile.py '{"method": "lookahead", "max_tokens_per_step": 0}'
    .venv/bin/python docs/bench/2026-11-25-attention/step_profile.py null   # no speculation

Run before and after the tree-attention change of commit 8ac2985 on the same machine; results in
docs/results.md, "2026-11-25 -- cheaper trees, ...", "Cheaper tree steps".
"""
import os, sys, time, json, collections
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
import torch
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm_lookahead.models import prepare_default_model
from vllm_lookahead.engine import attention, runner as runner_mod, verify_step as vs_mod


T = collections.defaultdict(float); N = collections.defaultdict(int)
def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[name] += time.perf_counter() - t; N[name] += 1
    return w

attention.fix_draft_rows = timed("tree_pass", attention.fix_draft_rows)
import vllm_lookahead.engine.patches as P
from vllm.v1.attention.backends import cpu_attn
from vllm import _custom_ops as ops
ops.cpu_attention_with_kv_cache = timed("vllm_kernel", ops.cpu_attention_with_kv_cache)
runner_mod.RunnerLookahead.propose = timed("propose", runner_mod.RunnerLookahead.propose)
runner_mod.verify_step = timed("verify", runner_mod.verify_step)
runner_mod.RunnerLookahead.on_prepare_inputs = timed("on_prepare", runner_mod.RunnerLookahead.on_prepare_inputs)

cfg = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
model = str(prepare_default_model())
llm = LLM(model=model, dtype="float32", enforce_eager=True, gpu_memory_utilization=0.3, max_model_len=2048,
          max_num_seqs=4, seed=0, enable_prefix_caching=False, speculative_config=cfg)
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
eng_runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
m = eng_runner.model
m.compute_logits = timed("logits", m.compute_logits)
orig_exec = type(eng_runner).execute_model
type(eng_runner).execute_model = timed("execute_model", orig_exec)
type(eng_runner).sample_tokens = timed("sample_tokens", type(eng_runner).sample_tokens)
tok = llm.get_tokenizer()
from vllm_lookahead.bench.prompts import category_prompts, tokenize
cats = os.environ.get("CATS", "mt_bench,code,summarization").split(",")
prompts = [ids for c in cats for _, ids in tokenize(category_prompts(c, int(os.environ.get("NPROMPTS", "2"))), tok, 1024)]
llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
T.clear(); N.clear()
t0 = time.perf_counter(); gen = 0
for p in prompts:
    out = llm.generate([TokensPrompt(prompt_token_ids=p)], SamplingParams(temperature=0, max_tokens=256), use_tqdm=False)
    gen += len(out[0].outputs[0].token_ids)
wall = time.perf_counter() - t0
steps = N["execute_model"]
print(f"CONFIG {cfg}")
print(f"tokens {gen} wall {wall:.2f}s  tok/s {gen/wall:.1f} steps {steps} MAT {gen/steps:.2f}")
for k in ("execute_model", "sample_tokens", "vllm_kernel", "tree_pass", "logits", "on_prepare", "verify", "propose"):
    print(f"  {k:14s} {T[k]*1e3/steps:7.2f} ms/step  (calls {N[k]})")
lk = eng_runner._lookahead
if lk is not None and lk.cost is not None:
    print("  cost:", lk.cost.describe())
