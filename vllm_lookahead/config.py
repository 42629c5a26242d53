"""User-facing lookahead parameters: one pydantic model, defaults, ranges, errors.

A user writes

    --speculative-config '{"method": "lookahead", "window_size": 7, "ngram_size": 5, "guess_set_size": 7}'

Everything but ``method`` is validated here.  A bad value or an unknown key raises
:class:`LookaheadConfigError` whose message names the field, the value given and
the valid range, so ``vllm serve`` fails at start-up with one readable line.

Symbols follow the paper (Fu et al., 2024, arXiv:2402.02057): W = window size
(lookahead columns), N = n-gram size (the window has N-1 levels), G = guess set
size (pool n-grams verified per step and kept per key token).

This is the project's only parameter object: the engine-free core
(:mod:`vllm_lookahead.core`) reads the same :class:`LookaheadConfig` the engine
builds from ``--speculative-config``, so code and tests built with
``LookaheadConfig()`` run the shipped defaults.  Ranges are declared once, on the
fields; error messages and the README table are derived from (and tested
against) them.  The step's mode (:class:`DraftMode`) is decided here, once.  The
benchmarks' ablations vary parts of the algorithm through :class:`Ablation`, which
is not a user key.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vllm_lookahead.core.mode import DraftMode

__all__ = [
    "ABLATION_KEY",
    "ADDITIONAL_CONFIG_KEY",
    "Ablation",
    "DraftMode",
    "LookaheadConfig",
    "LookaheadConfigError",
    "METHOD_NAME",
    "REMOVED_KEYS",
    "USER_KEYS",
    "field_range",
    "parameter_table",
]

METHOD_NAME = "lookahead"
# Key of vLLM's ``additional_config`` (its documented plugin slot, shipped to every
# engine and worker process with the VllmConfig) under which the validated config travels.
ADDITIONAL_CONFIG_KEY = "lookahead"
# Key of ``additional_config`` under which a benchmark or a test passes :class:`Ablation` settings.
ABLATION_KEY = "lookahead_ablation"


class LookaheadConfigError(ValueError):
    """A lookahead speculative config that cannot be used (bad value or unknown key)."""


class Ablation(BaseModel):
    """Parts of the algorithm the benchmarks' ablations and the tests switch off or vary.

    Not a user key: ``--speculative-config`` refuses these names, and the shipped values are
    the ones measured best (``seed`` is arbitrary).  A benchmark or a test sets them for an
    engine through vLLM's ``additional_config`` under :data:`ABLATION_KEY`, in code through
    ``LookaheadConfig(ablation=Ablation(...))``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    pool_from_prompt: bool = Field(True, description="seed the n-gram pool with the prompt")
    pool_from_output: bool = Field(True, description="the pool also learns accepted output n-grams")
    window_shift: Literal["one", "accepted"] = Field(
        "one",
        description="'one': the window slides one level per step (LADE/llama.cpp); "
        "'accepted': it also shifts by the number of accepted tokens",
    )
    merge_candidates: bool = Field(
        True, description="trie-merge greedy verification candidates that share a prefix (sampled ones always merge)"
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="seed of the window initialisation RNG")


class LookaheadConfig(BaseModel):
    """Lookahead decoding parameters (the keys of ``--speculative-config`` besides ``method``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    window_size: int = Field(
        7,
        ge=0,
        le=64,
        description="W: lookahead window columns (0: no lookahead branch; candidates then come from "
        "the prompt and output only)",
    )
    ngram_size: int = Field(5, ge=2, le=16, description="N: n-gram length; the window has N-1 levels")
    guess_set_size: int = Field(7, ge=0, le=64, description="G: pool n-grams verified per step and kept per key token")
    max_lead_tokens: int = Field(
        32,
        ge=0,
        le=256,
        description="the first (most likely) candidate grows past N-1 tokens by looking up the pools "
        "again with its own text, up to this many tokens (values <= N-1: the paper's N-1-token candidates)",
    )
    lookup_context: int = Field(
        3,
        ge=1,
        le=8,
        description="candidates are looked up by the last 1..lookup_context tokens, longest match "
        "first (1: the paper, by the last token only)",
    )
    shared_pool: bool = Field(
        False,
        description="also draft from n-grams of other requests' outputs (one bounded LRU pool per "
        "engine, token ids only); a request's speed may then depend on other clients' text, its "
        "output never does",
    )
    max_pool_keys: int = Field(65536, ge=1, le=10_000_000, description="key tokens kept per pool (LRU)")
    max_tokens_per_step: Annotated[int, Field(ge=0, le=65536)] | Literal["auto"] = Field(
        "auto",
        description="'auto': the draft rule sizes each request's draft from the forward cost measured "
        "on the running hardware and the request's acceptance; a number: a fixed cap on the tokens "
        "one forward carries for decoding requests (one each plus their drafts); 0: full trees, no cap",
    )
    # not a user key (from_user_dict refuses it): the benchmarks' and tests' settings
    ablation: Ablation = Field(default_factory=Ablation)

    @model_validator(mode="after")
    def _drafts_something(self) -> LookaheadConfig:
        if self.window_size == 0 and self.guess_set_size == 0:
            raise ValueError("window_size and guess_set_size are both 0: nothing would ever be drafted")
        return self

    # -- sizes derived from W, N, G ----------------------------------------------------
    @property
    def lead_tokens(self) -> int:
        """Longest lead candidate: ``max(N - 1, max_lead_tokens)``."""
        return max(self.ngram_size - 1, self.max_lead_tokens)

    @property
    def max_draft_tokens(self) -> int:
        """Upper bound of draft tokens per step (tree nodes minus the root).

        Lookahead branch: W*(N-1) nodes including the root; verification branch:
        G candidates of N-1 tokens each, the first of which may grow to
        max(N-1, max_lead_tokens).
        """
        levels = self.ngram_size - 1
        candidates = self.guess_set_size * levels
        if self.guess_set_size:
            candidates += self.lead_tokens - levels
        return max(0, self.window_size * levels - 1) + candidates

    # -- the step's mode (engine side) -----------------------------------------------------
    @property
    def mode(self) -> DraftMode:
        """How each step's trees are sized: decided here, once, from ``max_tokens_per_step``."""
        if self.max_tokens_per_step == "auto":
            return DraftMode.AUTO
        return DraftMode.FULL if self.max_tokens_per_step == 0 else DraftMode.CAP

    def draft_budget(self, num_decoding: int) -> int | None:
        """Under :attr:`DraftMode.CAP`: draft nodes each of ``num_decoding`` requests may add so the
        forward stays within the cap (None in the other modes)."""
        if self.mode is not DraftMode.CAP or num_decoding <= 0:
            return None
        return max(0, (int(self.max_tokens_per_step) - num_decoding) // num_decoding)

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_user_dict(cls, spec: dict[str, Any], ablation: dict[str, Any] | None = None) -> LookaheadConfig:
        """Validate a user's speculative-config dict (``method`` included); ``ablation``: the
        benchmarks' and tests' :class:`Ablation` settings (vLLM's ``additional_config``)."""
        if not isinstance(spec, dict):
            raise LookaheadConfigError(f"lookahead speculative config must be a JSON object, got {type(spec).__name__}")
        fields = {k.replace("-", "_"): v for k, v in spec.items() if k != "method"}
        for name, value in fields.items():
            if name in REMOVED_KEYS:
                raise LookaheadConfigError(f"lookahead speculative config: field '{name}' {REMOVED_KEYS[name]}")
            if name not in USER_KEYS:
                valid = ", ".join(["method", *USER_KEYS])
                raise LookaheadConfigError(
                    f"invalid lookahead speculative config: unknown field '{name}' (value {value!r}); "
                    f"valid fields: {valid}"
                )
        try:
            ablation_settings = Ablation(**(ablation or {}))
        except (TypeError, ValidationError) as exc:
            raise LookaheadConfigError(f"invalid lookahead ablation settings ({ABLATION_KEY}): {exc}") from None
        try:
            return cls(**fields, ablation=ablation_settings)
        except ValidationError as exc:
            raise LookaheadConfigError(_format_errors(exc, fields)) from None

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> LookaheadConfig:
        """The config :func:`vllm_lookahead.engine.hooks.startup.translate` stored in ``additional_config``."""
        raw = (getattr(vllm_config, "additional_config", None) or {}).get(ADDITIONAL_CONFIG_KEY)
        return cls.model_validate(raw or {}, strict=False)

    def summary(self) -> str:
        text = (
            f"W={self.window_size} N={self.ngram_size} G={self.guess_set_size} "
            f"(<= {self.max_draft_tokens} draft tokens/step, max_lead_tokens={self.max_lead_tokens}, "
            f"lookup_context={self.lookup_context}, shared_pool={self.shared_pool}, "
            f"max_tokens_per_step={self.max_tokens_per_step})"
        )
        if self.ablation != Ablation():
            text += f", ablation {self.ablation.model_dump(exclude_defaults=True)}"
        return text


USER_KEYS = tuple(name for name in LookaheadConfig.model_fields if name != "ablation")
# Keys earlier releases accepted, and what became of them (said in the error).
REMOVED_KEYS = {
    "num_speculative_tokens": "is not accepted: the draft size follows from window_size, ngram_size, "
    "guess_set_size and max_lead_tokens ((W*(N-1) - 1) + G*(N-1) tokens per step, plus the lead "
    "candidate's growth past N-1 up to max_lead_tokens)",
    "measure_drafting": "was removed: the draft rule alone decides what each step drafts (max_tokens_per_step 'auto')",
    "price_host_work": "was removed: the draft rule alone decides what each step drafts (max_tokens_per_step 'auto')",
    "price_verification": "was removed: under max_tokens_per_step 'auto' verification is always priced",
    "rest_idle_requests": "was removed: under max_tokens_per_step 'auto' idle requests always rest",
    **{
        name: "was removed from the user's config (an ablation setting of the benchmarks, fixed at its measured value)"
        for name in Ablation.model_fields
    },
}


def field_range(name: str) -> str:
    """The valid values of one field, in words, read off its declaration (e.g. 'an integer in [1, 64]')."""
    info = LookaheadConfig.model_fields.get(name) or Ablation.model_fields[name]
    return _describe(info.annotation, info.metadata)


def _bounds(metadata: list) -> tuple[Any, Any]:
    lo = hi = None
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Le):
            hi = m.le
    return lo, hi


def _describe(annotation: Any, metadata: list) -> str:
    if annotation is bool:
        return "true or false"
    if annotation is int:
        lo, hi = _bounds(metadata)
        return f"an integer in [{lo}, {hi}]"
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin is Annotated:
        base, *extra = typing.get_args(annotation)
        return _describe(base, [*metadata, *[m for e in extra for m in getattr(e, "metadata", [e])]])
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a, []) for a in typing.get_args(annotation)]
        literals = [p for p in parts if p.startswith("one of ")]
        others = [p for p in parts if not p.startswith("one of ")]
        words = [p.removeprefix("one of ") for p in literals] + others
        return " or ".join(words)
    raise TypeError(f"no range description for {annotation!r}")


def _format_errors(exc: ValidationError, given: dict[str, Any]) -> str:
    lines = []
    for err in exc.errors():
        if not err["loc"]:  # a rule across fields (model validator): its own message
            lines.append(str(err.get("ctx", {}).get("error", err["msg"])))
            continue
        field = str(err["loc"][0])
        if err["type"] == "extra_forbidden":
            valid = ", ".join(["method", *USER_KEYS])
            lines.append(f"unknown field '{field}' (value {given.get(field)!r}); valid fields: {valid}")
        else:
            rng = field_range(field) if field in LookaheadConfig.model_fields else "see the README"
            line = f"field '{field}' = {given.get(field)!r} is invalid: must be {rng}"
            if line not in lines:  # a union reports one error per member
                lines.append(line)
    return "invalid lookahead speculative config: " + "; ".join(lines)


def parameter_table() -> str:
    """The README's parameter table (Markdown), generated from the fields: key, default, valid
    values, meaning.  A test keeps the README's copy equal to it."""
    rows = ["| key | default | valid values | meaning |", "|---|---|---|---|"]
    for name in USER_KEYS:
        info = LookaheadConfig.model_fields[name]
        default = str(info.default).lower() if isinstance(info.default, bool) else info.default
        default = f'`"{default}"`' if isinstance(info.default, str) else f"`{default}`"
        rows.append(f"| `{name}` | {default} | {field_range(name)} | {info.description} |")
    return "\n".join(rows)
