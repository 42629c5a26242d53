"""Per-request lookahead settings, carried in ``SamplingParams.extra_args``.

vLLM's channel for request arguments that extensions read is ``SamplingParams.extra_args``;
the OpenAI server fills it from the request body's ``vllm_xargs`` (flat values: strings,
numbers, lists).  Lookahead reads two kinds of entries there and leaves every other one alone:

``"lookahead": "off"``
    no drafts for this request (exactly vLLM without speculation for it); the other requests of
    the batch keep drafting.  ``"on"`` is the default: drafting as configured.  Booleans are
    accepted too (JSON ``true``/``false`` reach vLLM's request model as 1/0, also accepted).
``"lookahead_<key>": value``
    one of the size limits :data:`PER_REQUEST` (``window_size``, ``guess_set_size``,
    ``max_lead_tokens``) for this request, at most the engine's value (vLLM fixes the
    draft-token budget, ``num_speculative_tokens``, from the engine's config at start).  The
    request's config is the engine's with these keys replaced, validated by that same model (its
    ranges and its cross-field rule), so the rules are written once.  The other config keys
    (:data:`PER_ENGINE`) and unknown ``lookahead_*`` keys are errors.

Where (see docs/design.md, "Per-request settings"):

* **validated** in the process that accepts the request, where vLLM validates sampling
  parameters -- ``InputProcessor._validate_params``, wrapped in :mod:`vllm_lookahead.engine.hooks.patches`
  (:func:`check_request`) -- so a bad value is a :class:`RequestOverrideError`: vLLM's
  ``VLLMValidationError`` (an HTTP 400 naming the key) and a ``ValueError`` for ``LLM.generate``
  callers, raised before the request reaches the engine;
* **applied** by the worker when it creates the request's state
  (``RunnerLookahead.propose`` -> :func:`for_request`); ``"off"`` is also a reason of
  :func:`.eligibility.draft_blocker` (metric label ``request``).

Engines without lookahead ignore these keys, as vLLM ignores ``extra_args`` nobody reads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from vllm.exceptions import VLLMValidationError

from vllm_lookahead.config import LookaheadConfig, field_range

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format

SWITCH = "lookahead"  # "on" / "off"
PREFIX = "lookahead_"  # "lookahead_<config key>"

# Config keys a request may set, each up to the engine's value: the largest tree a request may
# build follows from them, and vLLM sizes its draft-token budget (num_speculative_tokens) from the
# engine's (README "Per-request control" lists them).
PER_REQUEST = ("window_size", "guess_set_size", "max_lead_tokens")
# Config keys fixed for the whole engine, and why (said in the error).
PER_ENGINE = {
    "ngram_size": "vLLM's draft-token budget and the shared pool's n-grams follow from it",
    "lookup_context": "the shared pool is keyed by that many tokens",
    "shared_pool": "the shared pool is one per engine, for every request or for none",
    "max_pool_keys": "it bounds the memory of every request's pools",
    "max_tokens_per_step": "it sizes the whole batch's step, not one request's",
}

_ON = {"on": True, "off": False}


class RequestOverrideError(VLLMValidationError, ValueError):
    """Lookahead keys in a request's ``extra_args`` that cannot be used: vLLM answers HTTP 400
    with the message (``parameter`` = the key); ``LLM.generate`` raises it as a ``ValueError``.
    A client error of vLLM's own kind because ``AsyncLLM`` passes those on to the server's 400
    handler, while any other exception from input processing becomes a 500."""


@dataclass(frozen=True)
class RequestSettings:
    """What a request asked for: drafting on or off, and its config (the engine's with the
    request's keys applied)."""

    enabled: bool
    config: LookaheadConfig
    keys: tuple[str, ...]  # the config keys the request set


def lookahead_entries(extra_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """The entries of ``extra_args`` lookahead reads (``lookahead`` and ``lookahead_*``)."""
    if not extra_args or not isinstance(extra_args, Mapping):
        return {}
    return {k: v for k, v in extra_args.items() if isinstance(k, str) and (k == SWITCH or k.startswith(PREFIX))}


def parse(extra_args: Mapping[str, Any] | None, engine: LookaheadConfig) -> RequestSettings | None:
    """The request's settings under the ``engine``'s config; None when it sets none.
    Raises :class:`RequestOverrideError` naming the first key that cannot be used."""
    given = lookahead_entries(extra_args)
    if not given:
        return None
    enabled = _switch(given.pop(SWITCH)) if SWITCH in given else True
    fields: dict[str, Any] = {}
    for key, value in given.items():
        name = key[len(PREFIX) :]
        if name in PER_ENGINE:
            raise _error(
                key,
                f"{name} is set for the whole engine at start (--speculative-config), not per "
                f"request: {PER_ENGINE[name]}; per-request keys: {_keys()}",
            )
        if name not in PER_REQUEST:
            raise _error(key, f"unknown lookahead key {key!r}; per-request keys: {_keys()}")
        fields[name] = value
    try:
        config = LookaheadConfig.model_validate({**engine.model_dump(), **fields}) if fields else engine
    except ValidationError as exc:
        raise _validation_error(exc, fields) from None
    for name in PER_REQUEST:
        if name in fields and getattr(config, name) > getattr(engine, name):
            raise _error(
                PREFIX + name,
                f"{PREFIX + name} = {fields[name]!r} is above this engine's {name} {getattr(engine, name)}: "
                f"a request may lower it, not raise it (vLLM sizes its draft-token budget from the "
                f"engine's config at start)",
            )
    return RequestSettings(enabled, config, tuple(fields))


def check_request(vllm_config: Any, params: Any) -> None:
    """Front end (the wrapper of ``InputProcessor._validate_params``): raise
    :class:`RequestOverrideError` if ``params`` carries lookahead keys a lookahead engine cannot
    use.  Requests without such keys, and engines without lookahead, cost a dict scan at most."""
    extra = getattr(params, "extra_args", None)
    if not extra or not lookahead_entries(extra):
        return
    from vllm_lookahead.engine.hooks.startup import is_lookahead_config

    if not is_lookahead_config(getattr(vllm_config, "speculative_config", None)):
        return
    parse(extra, LookaheadConfig.from_vllm_config(vllm_config))


def for_request(engine: LookaheadConfig, sampling_params: Any, shared: Any) -> tuple[LookaheadConfig, Any]:
    """Worker: (config, shared pool or None) to build a new request's state with.

    A request turned off gets a state that learns nothing (no window, no pools fed; it is never
    drafted: :func:`turned_off`).  Keys the front end validated cannot fail here; a request that
    reached the engine another way with keys that cannot be used drafts under the engine's
    config (logged), never stopping the engine."""
    extra = getattr(sampling_params, "extra_args", None)
    if not extra:
        return engine, shared
    try:
        settings = parse(extra, engine)
    except RequestOverrideError as exc:
        logger.warning(
            "lookahead: a request's lookahead keys were ignored (the engine's config drafts for it): %s", exc
        )
        return engine, shared
    if settings is None:
        return engine, shared
    if not settings.enabled:
        learns_nothing = engine.ablation.model_copy(update=dict(pool_from_prompt=False, pool_from_output=False))
        return engine.model_copy(update=dict(window_size=0, ablation=learns_nothing)), None
    return settings.config, shared


def turned_off(sampling_params: Any) -> bool:
    """Whether the request asked for no drafts (``"lookahead": "off"``); O(1)."""
    extra = getattr(sampling_params, "extra_args", None)
    if not extra or not isinstance(extra, Mapping) or SWITCH not in extra:
        return False
    try:
        return not _switch(extra[SWITCH])
    except RequestOverrideError:
        return False


# -- values and messages ----------------------------------------------------------------


def _switch(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):  # a JSON boolean, as vLLM's request model delivers it
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _ON:
        return _ON[value.strip().lower()]
    raise _error(
        SWITCH,
        f"{SWITCH!r} = {value!r} is invalid: must be 'on' or 'off' (per-key settings are separate keys: {PREFIX}<key>)",
    )


def _keys() -> str:
    return ", ".join([SWITCH, *(PREFIX + k for k in PER_REQUEST)])


def _error(key: str, message: str) -> RequestOverrideError:
    return RequestOverrideError(f"invalid lookahead request parameter: {message}", parameter=key)


def _validation_error(exc: ValidationError, fields: dict[str, Any]) -> RequestOverrideError:
    """The model's errors in the request's terms: the key given, its value, the valid range."""
    lines: list[str] = []
    first: str | None = None
    for err in exc.errors():
        if not err["loc"]:  # the model's rule across fields: its own message
            line = str(err.get("ctx", {}).get("error", err["msg"]))
            if "both 0" in line:
                line += f" (for a request without drafts, send {SWITCH!r}: 'off')"
            key = next((PREFIX + k for k in ("window_size", "guess_set_size") if k in fields), None)
        else:
            name = str(err["loc"][0])
            key = PREFIX + name
            line = f"{key} = {fields.get(name)!r} is invalid: {name} must be {field_range(name)}"
        first = first or key
        if line not in lines:  # a union reports one error per member
            lines.append(line)
    return RequestOverrideError("invalid lookahead request parameter: " + "; ".join(lines), parameter=first)
