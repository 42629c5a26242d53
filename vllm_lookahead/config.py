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
against) them.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

METHOD_NAME = "lookahead"
# Key of vLLM's ``additional_config`` (its documented plugin slot, shipped to every
# engine and worker process with the VllmConfig) under which the validated config travels.
ADDITIONAL_CONFIG_KEY = "lookahead"


class LookaheadConfigError(ValueError):
    """A lookahead speculative config that cannot be used (bad value or unknown key)."""


class LookaheadConfig(BaseModel):
    """Lookahead decoding parameters (the keys of ``--speculative-config`` besides ``method``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    window_size: int = Field(
        7, ge=0, le=64,
        description="W: lookahead window columns (0: no lookahead branch; candidates then come from "
        "the prompt and output only)",
    )
    ngram_size: int = Field(5, ge=2, le=16, description="N: n-gram length; the window has N-1 levels")
    guess_set_size: int = Field(
        7, ge=0, le=64, description="G: pool n-grams verified per step and kept per key token"
    )
    pool_from_prompt: bool = Field(True, description="seed the n-gram pool with the prompt")
    pool_from_output: bool = Field(True, description="the pool also learns accepted output n-grams")
    window_shift: Literal["one", "accepted"] = Field(
        "one",
        description="'one': the window slides one level per step (LADE/llama.cpp); "
        "'accepted': it also shifts by the number of accepted tokens",
    )
    merge_candidates: bool = Field(
        True,
        description="trie-merge verification candidates that share a prefix (greedy: the same tokens "
        "per step from 6-14 % fewer draft tokens, docs/results.md; sampled requests always merge)",
    )
    max_pool_keys: int = Field(65536, ge=1, le=10_000_000, description="key tokens kept per pool (LRU)")
    shared_pool: bool = Field(
        False,
        description="also draft from n-grams of other requests' outputs (one bounded LRU pool per "
        "engine, token ids only, like suffix decoding's cache); off by default: a request's speed "
        "may then depend on other clients' text (outputs never do)",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="seed of the window initialisation RNG")
    lookup_context: int = Field(
        3, ge=1, le=8,
        description="candidates are looked up by the last 1..lookup_context tokens, longest match "
        "first (1 = the paper: by the last token only; 3 accepted 1-6 % more tokens per step "
        "than 1 in docs/results.md)",
    )
    max_lead_tokens: int = Field(
        32, ge=0, le=256,
        description="the first (most likely) candidate grows past N-1 tokens, by looking up the "
        "pools again with its own text, while it is accepted in full: its length doubles per fully "
        "accepted step up to this and falls back to N-1 at a miss (values <= N-1: the paper, "
        "candidates of N-1 tokens)",
    )
    max_tokens_per_step: Annotated[int, Field(ge=0, le=65536)] | Literal["auto"] = Field(
        "auto",
        description="'auto': the cost-aware draft rule chooses each step's lead length, candidates "
        "and window columns per request from the forward cost measured on the running hardware "
        "and each request's acceptance (docs/design.md); a number: a fixed cap on the tokens one "
        "forward carries for decoding requests (one each plus their drafts), drafts cut to fit "
        "equally per request, full trees when they fit; 0 = full trees, no cap",
    )

    measure_drafting: bool = Field(
        False,
        description="with max_tokens_per_step 'auto': also time decode steps with and without drafts "
        "per batch size and draft only where drafting has emitted at least the tokens per second of "
        "not drafting (core/draft_gate.py; off by default: in two side-by-side runs the rule alone "
        "was faster in 26 of 32 cells and slower in 4, docs/results.md); output is the same either way",
    )

    price_host_work: bool = Field(
        False,
        description="with max_tokens_per_step 'auto', opt-in: a step drafts only if its plan beats not "
        "drafting with the host's proposal work (measured in this worker) priced in, and a batch "
        "whose plans draft none of the candidates offered two steps running rests from proposing "
        "for a growing number of steps (engine/step_timing.py; off by default: a second side-by-side "
        "run did not repeat the first's gain, and it is unmeasured on a GPU); output is the same "
        "either way",
    )

    price_verification: bool = Field(
        True,
        description="with max_tokens_per_step 'auto': a request drafts only where its draft pays the "
        "host time verifying its tree takes (its target distributions and the walk; measured in this "
        "worker for greedy and sampled requests apart, not under tensor parallelism), a fixed price "
        "per drafting request whatever the draft's size; output is the same either way",
    )
    rest_idle_requests: bool = Field(
        True,
        description="with max_tokens_per_step 'auto': a request that was offered to the draft rule "
        "and drafted nothing on two proposals running skips the next 1, 2, 4 up to 8 proposals (no "
        "lookups, its pools catch up later), where proposing costs at least 2% of the step's forward "
        "per request (measured in this worker; not under tensor parallelism); output is the same either way",
    )

    @model_validator(mode="after")
    def _drafts_something(self) -> "LookaheadConfig":
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

    # -- the per-step token cap (engine side) ---------------------------------------------
    @property
    def cost_rule(self) -> bool:
        """Whether the cost-aware draft rule sizes each step's trees (``max_tokens_per_step: "auto"``)."""
        return self.max_tokens_per_step == "auto"

    def draft_budget(self, num_decoding: int) -> int | None:
        """Under a fixed cap: draft nodes each of ``num_decoding`` requests may add so the forward
        stays within it (None = no cap, or the cost rule decides)."""
        cap = 0 if self.cost_rule else int(self.max_tokens_per_step)
        if cap and num_decoding > 0:
            return max(0, (cap - num_decoding) // num_decoding)
        return None

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_user_dict(cls, spec: dict[str, Any]) -> "LookaheadConfig":
        """Validate a user's speculative-config dict (``method`` included)."""
        if not isinstance(spec, dict):
            raise LookaheadConfigError(
                f"lookahead speculative config must be a JSON object, got {type(spec).__name__}"
            )
        fields = {k.replace("-", "_"): v for k, v in spec.items() if k != "method"}
        if "num_speculative_tokens" in fields:
            raise LookaheadConfigError(
                "lookahead speculative config: field 'num_speculative_tokens' is not accepted; "
                "the draft size follows from window_size, ngram_size, guess_set_size and "
                "max_lead_tokens ((W*(N-1) - 1) + G*(N-1) tokens per step, plus the lead "
                "candidate's growth past N-1 up to max_lead_tokens)"
            )
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise LookaheadConfigError(_format_errors(exc, fields)) from None

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> "LookaheadConfig":
        """The config :func:`vllm_lookahead.engine.startup.translate` stored in ``additional_config``."""
        raw = (getattr(vllm_config, "additional_config", None) or {}).get(ADDITIONAL_CONFIG_KEY)
        return cls.model_validate(raw or {}, strict=False)

    def summary(self) -> str:
        return (
            f"W={self.window_size} N={self.ngram_size} G={self.guess_set_size} "
            f"(<= {self.max_draft_tokens} draft tokens/step, shift={self.window_shift}, "
            f"pool_from_prompt={self.pool_from_prompt}, pool_from_output={self.pool_from_output}, "
            f"shared_pool={self.shared_pool}, "
            f"lookup_context={self.lookup_context}, max_lead_tokens={self.max_lead_tokens}, "
            f"max_tokens_per_step={self.max_tokens_per_step})"
        )


def field_range(name: str) -> str:
    """The valid values of one field, in words, read off its declaration (e.g. 'an integer in [1, 64]')."""
    info = LookaheadConfig.model_fields[name]
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
            valid = ", ".join(["method", *LookaheadConfig.model_fields])
            lines.append(f"unknown field '{field}' (value {given.get(field)!r}); valid fields: {valid}")
        else:
            rng = field_range(field) if field in LookaheadConfig.model_fields else "see the README"
            line = f"field '{field}' = {given.get(field)!r} is invalid: must be {rng}"
            if line not in lines:  # a union reports one error per member
                lines.append(line)
    return "invalid lookahead speculative config: " + "; ".join(lines)
