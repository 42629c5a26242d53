"""The numbers fitted to measurements, each with its provenance: ``fitted.json`` next to this module.

The draft rule's acceptance model (:mod:`.draft_rule`: how likely a lead's tokens are accepted
by where it was found, what a further candidate or window column adds) and the bundled CPU
forward-cost profile (:mod:`vllm_lookahead.engine.propose.cost_profile`) are measurements of a model on
a machine, not design choices.  They live in one data file, shipped with the package, where each
entry names the recording it was fitted on (``docs/bench/...``), where the fit is written up
(``docs/archive/...``) and the command that refits it; the modules that use them read
:data:`FITTED` once, at import.  Refitting is editing the file: the code does not change.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

FITTED_FILE = "fitted.json"
PROVENANCE = ("what", "recording", "results", "fit", "refit")  # what every entry says besides its value


class FittedFileError(ValueError):
    """``fitted.json`` lacks a value or part of an entry's provenance."""


def load(text: str | None = None) -> dict[str, Any]:
    """``name -> value`` of every entry of ``text`` (by default the shipped ``fitted.json``), after
    checking that each has a value and all of :data:`PROVENANCE`."""
    if text is None:
        text = resources.files(__package__).joinpath(FITTED_FILE).read_text(encoding="utf-8")
    entries = json.loads(text)["entries"]
    values = {}
    for name, entry in entries.items():
        missing = ["value"] if "value" not in entry else []
        missing += [key for key in PROVENANCE if not entry.get(key)]
        if missing:
            raise FittedFileError(f"{FITTED_FILE}: entry {name!r} lacks {', '.join(missing)}")
        values[name] = entry["value"]
    return values


FITTED: dict[str, Any] = load()

__all__ = ["FITTED", "FITTED_FILE", "FittedFileError", "PROVENANCE", "load"]
