"""A tiny random-weight Llama with a real BPE tokenizer, for fast offline tests.

:func:`build_toy_llama` writes a Hugging Face folder (``config.json``,
``model.safetensors`` in float32, ``tokenizer.json`` + chat template,
``generation_config.json``) that vLLM's CPU backend can load.  Nothing is downloaded:

* the tokenizer is a byte-level BPE trained with the ``tokenizers`` library on the source
  of a fixed list of Python standard-library modules (always present offline), read in a
  fixed order;
* the weights are drawn from ``torch.Generator().manual_seed(seed)`` in a fixed order,
  so the same parameters give the same weights on every machine (and, with the same
  Python/tokenizers/transformers versions, the same files byte for byte).

Greedy decoding of a random model with the usual small init (std 0.02) has near-tied top
logits, which makes token-exactness tests depend on attention-kernel rounding.  Scaling
the logits up does not help (rounding noise scales with them).  This model is instead
built so that most greedy steps are decided by a wide margin while the context still
matters:

* embeddings are N(0, 1); attention/MLP projections N(0, 1/fan_in), with the output
  projections (``o_proj``, ``down_proj``) scaled by :data:`CONTEXT_GAIN`;
* the LM head is a *successor map*: row ``succ(i)`` is the embedding of token ``i`` (plus
  :data:`HEAD_NOISE` times a Gaussian), where ``succ`` is a permutation of the ordinary
  tokens made of cycles of length ``cycle_len``.  The current token's embedding dominates
  the final hidden state, so greedy output mostly walks these cycles (it loops, which
  makes n-gram hits frequent); on roughly 10% of the steps the attention/MLP context
  overrides it, so outputs depend on earlier tokens and on positions (a wrong KV entry or
  RoPE position changes the output of most prompts within 32 tokens).

Measured with the defaults (seed 0, :data:`DEFAULT_PROMPTS`, 64 greedy tokens each = 1280
steps, HF float32): smallest top-1/top-2 logit gap 1.8e-3, 1st percentile 0.02, median
2.0, while float32-vs-float64 and sdpa-vs-eager logit differences are <= 7e-6 (worst-step
margin ~270x).  vLLM 0.32 CPU (float32) reproduces the HF greedy tokens on all 20 prompts,
its logprobs differ from HF by <= 5e-6, and batched vs single-request logprobs are equal.
A plain N(0, 1) random model with the same logit scale had a smallest gap of 3e-4 against
6e-5 rounding error (~6x).
Use :func:`greedy_logit_gaps` to check.  The LM-head rows of the special tokens (and of
any id the tokenizer does not use) are zero, so greedy decoding never emits EOS: every
request runs to ``max_tokens``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "cycle_prompt",
    "DEFAULT_PROMPTS",
    "LOGIT_STD",
    "build_toy_llama",
    "successor_map",
    "greedy_logit_gaps",
    "toy_corpus",
]

TOY_MARKER = ".toy-complete"
TOY_FORMAT = 1
LOGIT_STD = 16.0  # scale of the successor logit (about LOGIT_STD * cos(h, e_token))
CONTEXT_GAIN = 2.0  # scale of o_proj/down_proj (x sqrt(2 / num_layers)): how much context matters
HEAD_NOISE = 0.5  # Gaussian part of the LM head, relative to the successor part
DEFAULT_CYCLE_LEN = 8
SUPPORTED_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM CPU_ATTN

BOS, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Modules present in every CPython >= 3.10 as plain source files; order matters.
_CORPUS_MODULES = (
    "argparse",
    "textwrap",
    "string",
    "functools",
    "dataclasses",
    "enum",
    "json.decoder",
    "json.encoder",
    "calendar",
    "difflib",
    "heapq",
    "bisect",
    "random",
    "statistics",
    "fractions",
    "shlex",
    "glob",
    "fnmatch",
    "csv",
    "configparser",
    "logging",
    "pprint",
    "inspect",
    "ast",
    "tokenize",
    "contextlib",
    "abc",
    "copy",
    "queue",
    "sched",
    "http.client",
    "email.message",
    "urllib.parse",
    "zipfile",
    "tarfile",
    "gettext",
    "locale",
    "datetime",
    "decimal",
    "typing",
    "unittest.case",
    "doctest",
)

DEFAULT_PROMPTS = (
    "def fibonacci(n):",
    "The quick brown fox",
    "import os\nimport sys\n",
    "Return a list of the lines in the string,",
    'class Parser(object):\n    """',
    "for i in range(10):",
    "Raise ValueError if the argument",
    "# Copyright",
    "self.assertEqual(",
    "The default value is",
    "if __name__ == '__main__':",
    "with open(filename) as f:",
    "This module provides",
    "try:\n    import",
    "return self._",
    "Example usage:",
    "def __init__(self, *args, **kwargs):",
    "An error occurred while",
    "lambda x: x +",
    "Hello, how are you today?",
)


def toy_corpus() -> list[str]:
    """The training text: source of a fixed list of standard-library modules, in order."""
    texts = []
    for name in _CORPUS_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None) if spec else None
        if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
            continue
        with open(origin, encoding="utf-8", errors="replace") as fh:
            texts.append(fh.read())
    if len(texts) < 10:
        raise RuntimeError("could not read enough Python standard-library sources to train a tokenizer")
    return texts


def _train_tokenizer(vocab_target: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_target,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(toy_corpus(), trainer=trainer)
    return tok


@contextlib.contextmanager
def _one_torch_thread():
    """Tiny matrices: one thread is faster, and far faster when other processes (a vLLM
    engine, say) keep the cores busy and OpenMP workers would spin against them."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _params(
    seed, num_layers, hidden_size, num_heads, num_kv_heads, vocab_target, cycle_len, logit_std=LOGIT_STD
) -> dict[str, Any]:
    return {
        "format": TOY_FORMAT,
        "seed": seed,
        "num_layers": num_layers,
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "vocab_target": vocab_target,
        "cycle_len": cycle_len,
        "logit_std": logit_std,
        "context_gain": CONTEXT_GAIN,
        "head_noise": HEAD_NOISE,
    }


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / TOY_MARKER).read_text())
    except (OSError, ValueError):
        return None


def successor_map(num_tokens: int, first: int, cycle_len: int, seed: int):
    """The permutation ``succ`` (a LongTensor over ``range(num_tokens)``) used by the LM head.

    Ids ``< first`` (special tokens) map to themselves and are never produced; the others
    are shuffled with ``seed`` and cut into cycles of ``cycle_len`` (0 = one random permutation).
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1_000_003)
    ids = torch.arange(first, num_tokens)
    order = ids[torch.randperm(len(ids), generator=gen)]
    succ = torch.arange(num_tokens)
    if cycle_len <= 0:
        succ[order] = torch.roll(order, -1)
        return succ
    for start in range(0, len(order), cycle_len):
        cyc = order[start : start + cycle_len]
        succ[cyc] = torch.roll(cyc, -1)
    return succ


def _init_weights(
    model, seed: int, num_tokens: int, num_special: int, cycle_len: int, logit_std: float = LOGIT_STD
) -> None:
    import torch

    cfg = model.config
    d = cfg.hidden_size
    gen = torch.Generator().manual_seed(seed)
    out_gain = CONTEXT_GAIN * (2.0 / cfg.num_hidden_layers) ** 0.5
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name in sorted(params):
            p = params[name]
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            if name.startswith("lm_head"):
                continue
            w = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "embed_tokens" in name:
                std = 1.0
            else:
                std = 1.0 / p.shape[-1] ** 0.5  # fan-in
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    std *= out_gain
            p.copy_(w * std)
        emb = params["model.embed_tokens.weight"]
        succ = successor_map(num_tokens, num_special, cycle_len, seed)
        head = torch.zeros_like(emb)
        head[succ[num_special:]] = emb[num_special:num_tokens]
        noise = torch.randn(head.shape, generator=gen, dtype=torch.float32)
        head = (head + HEAD_NOISE * noise) * (logit_std / d)
        head[:num_special] = 0.0  # never EOS/BOS/PAD
        head[num_tokens:] = 0.0  # ids the tokenizer does not have
        params["lm_head.weight"].copy_(head)


def build_toy_llama(
    path: Path,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 128,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    vocab_target: int = 2048,
    cycle_len: int = DEFAULT_CYCLE_LEN,
    logit_std: float = LOGIT_STD,
) -> Path:
    """Write (or reuse) a tiny random Llama + BPE tokenizer as an HF folder at ``path``.

    If ``path`` already holds a toy model built with the same parameters it is returned
    as is.  The folder is built in a temporary sibling and renamed into place, so an
    interrupted build never leaves a half folder.  Returns ``path``.  ``cycle_len`` sets
    how quickly greedy output loops (see the module docstring; 0 = no short loops);
    ``logit_std`` how peaked the next-token distribution is (the default model is nearly
    uniform over its tail at temperature 1; sampling tests use a sharper one, so drafts
    get accepted at temperature 1 too).
    """
    path = Path(path)
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    head_dim = hidden_size // num_heads
    if head_dim not in SUPPORTED_HEAD_SIZES:
        raise ValueError(f"head size {head_dim} is not supported by vLLM's CPU attention {SUPPORTED_HEAD_SIZES}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if vocab_target < 300:
        raise ValueError("vocab_target must be at least 300 (256 byte tokens + specials + merges)")

    params = _params(seed, num_layers, hidden_size, num_heads, num_kv_heads, vocab_target, cycle_len, logit_std)
    marker = _read_marker(path)
    if marker is not None and marker.get("params") == params:
        return path
    if path.exists() and any(path.iterdir()) and marker is None and not (path / "config.json").exists():
        raise FileExistsError(f"{path} exists, is not empty and is not a model folder; refusing to overwrite it")

    import tokenizers
    import torch
    import transformers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = _train_tokenizer(vocab_target)
    n_tok = tok.get_vocab_size()
    special_ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    assert special_ids == [0, 1, 2], special_ids

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=PAD,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=vocab_target,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attention_bias=False,
        mlp_bias=False,
    )
    config.dtype = torch.float32
    with _one_torch_thread():
        model = LlamaForCausalLM(config).to(torch.float32)
        _init_weights(model, seed, n_tok, len(SPECIAL_TOKENS), cycle_len, logit_std)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        hf_tok.save_pretrained(tmp)
        weights_sha = hashlib.sha256((tmp / "model.safetensors").read_bytes()).hexdigest()
        info = {
            "params": params,
            "tokenizer_vocab": n_tok,
            "weights_sha256": weights_sha,
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
            },
        }
        (tmp / TOY_MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700, safetensors writes 0600
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~umask)
        # Another builder may have won the race meanwhile.
        other = _read_marker(path)
        if other is not None and other.get("params") == params:
            return path
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / "x")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def cycle_prompt(path: Path, length: int, start: int = 100) -> list[int]:
    """``length`` token ids walking the built model's successor cycle through ``start``.

    The model's most likely continuation of such a prompt is the next token of the cycle,
    which the prompt itself holds: a copy-friendly prompt (drafts from it get accepted).
    """
    marker = _read_marker(Path(path))
    if marker is None:
        raise FileNotFoundError(f"no toy model at {path}")
    params = marker["params"]
    succ = successor_map(marker["tokenizer_vocab"], len(SPECIAL_TOKENS), params["cycle_len"], params["seed"])
    tokens = [start]
    while len(tokens) < length:
        tokens.append(int(succ[tokens[-1]]))
    return tokens


def greedy_logit_gaps(
    path: Path,
    prompts: Iterable[str] = DEFAULT_PROMPTS,
    max_new_tokens: int = 64,
) -> list[list[float]]:
    """Run the HF model (float32) greedily; return, per prompt, the top1-top2 logit gap at each step.

    Prompts are tokenized without special tokens, as vLLM does for this tokenizer.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    gaps: list[list[float]] = []
    with _one_torch_thread():
        _greedy_gaps(model, tokenizer, prompts, max_new_tokens, gaps)
    return gaps


def _greedy_gaps(model, tokenizer, prompts, max_new_tokens, gaps) -> None:
    import torch

    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
            row = []
            for step_logits in out.logits:
                top2 = torch.topk(step_logits[0].float(), 2).values
                row.append(float(top2[0] - top2[1]))
            gaps.append(row)
