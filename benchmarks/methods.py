"""Speculation methods the benchmark compares, by short spec strings.

``none``
    no speculation (the reference for speedup and exactness)
``ngram[:{json}]``
    vLLM's prompt-lookup drafter; default ``k=4``, lookup 2..4 (the settings of the
    ngram reference figure in docs/results.md, MAT ~1.9 on chat and code); the JSON overrides vLLM keys
``suffix[:{json}]``
    vLLM's suffix decoding (needs ``arctic-inference``; skipped with the reason
    when it cannot be imported)
``lookahead[:{json}]``
    this plugin; the JSON holds lookahead keys (window_size, ngram_size, ...) and, for the
    ablations, :class:`~vllm_lookahead.config.Ablation` keys (pool_from_prompt, merge_candidates,
    ...), which reach the engine through vLLM's ``additional_config`` (:func:`engine_arguments`)
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field

NGRAM_DEFAULTS = {"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SUFFIX_DEFAULTS: dict = {}


@dataclass(frozen=True)
class Method:
    label: str
    speculative_config: dict | None
    skip_reason: str | None = None  # set when the method cannot run here
    spec: str = field(default="", compare=False)  # the string it was parsed from


def _overrides(kind: str, rest: str) -> dict:
    if not rest:
        return {}
    try:
        value = json.loads(rest)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{kind}: overrides must be a JSON object, got {rest!r} ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{kind}: overrides must be a JSON object, got {rest!r}")
    return value


def _short(d: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in d.items())


def parse_method(spec: str) -> Method:
    kind, _, rest = spec.strip().partition(":")
    kind = kind.lower()
    extra = _overrides(kind, rest)
    if kind == "none":
        if extra:
            raise ValueError("none takes no overrides")
        return Method("no-spec", None, spec=spec)
    if kind == "ngram":
        cfg = {**NGRAM_DEFAULTS, **extra}
        label = f"ngram k={cfg['num_speculative_tokens']} lookup {cfg['prompt_lookup_min']}..{cfg['prompt_lookup_max']}"
        return Method(label, {"method": "ngram", **cfg}, spec=spec)
    if kind == "suffix":
        cfg = {**SUFFIX_DEFAULTS, **extra}
        skip = None
        if importlib.util.find_spec("arctic_inference") is None:
            skip = "arctic-inference is not installed (pip install 'vllm-lookahead[suffix]')"
        return Method("suffix" + (f" {_short(cfg)}" if cfg else ""), {"method": "suffix", **cfg}, skip, spec=spec)
    if kind == "lookahead":
        cfg = lookahead_config(extra)  # fail early, naming the field
        label = f"lookahead W{cfg.window_size} N{cfg.ngram_size} G{cfg.guess_set_size}"
        rest_keys = {k: v for k, v in extra.items() if k not in ("window_size", "ngram_size", "guess_set_size")}
        if rest_keys:
            label += f" {_short(rest_keys)}"
        return Method(label, {"method": "lookahead", **extra}, spec=spec)
    raise ValueError(f"unknown method {kind!r}: use none, ngram, suffix or lookahead (optionally :JSON)")


DEFAULT_METHODS = ("none", "ngram", "suffix", "lookahead")


def _split_ablation(spec: dict) -> tuple[dict, dict]:
    """(user keys, ablation keys) of a lookahead method's JSON."""
    from vllm_lookahead.config import Ablation

    ablation = {k: v for k, v in spec.items() if k in Ablation.model_fields}
    return {k: v for k, v in spec.items() if k not in ablation}, ablation


def lookahead_config(spec: dict):
    """The :class:`~vllm_lookahead.config.LookaheadConfig` of a lookahead method's JSON (``method``
    and ablation keys included), validated as the engine validates it."""
    from vllm_lookahead.config import LookaheadConfig

    user, ablation = _split_ablation(spec)
    return LookaheadConfig.from_user_dict(user, ablation=ablation)


def engine_arguments(speculative_config: dict | None) -> dict:
    """vLLM engine arguments for a method's recorded speculative config: a lookahead method's
    ablation keys go to ``additional_config``, where the plugin reads them."""
    if speculative_config is None:
        return {}
    if speculative_config.get("method") != "lookahead":
        return {"speculative_config": speculative_config}
    from vllm_lookahead.config import ABLATION_KEY

    user, ablation = _split_ablation(speculative_config)
    return {"speculative_config": user, **({"additional_config": {ABLATION_KEY: ablation}} if ablation else {})}
