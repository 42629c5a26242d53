"""The fitted numbers' data file (core/fitted.json, read by core/fitted.py): it loads, every entry
says where it came from, and what it points to exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_lookahead.core import fitted

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = json.loads((ROOT / "vllm_lookahead" / "core" / fitted.FITTED_FILE).read_text())["entries"]


def test_the_file_loads_with_a_value_for_each_entry():
    assert set(fitted.FITTED) == set(ENTRIES) and fitted.FITTED == fitted.load()
    assert {
        "draft_rule.PRIORS",
        "draft_rule.LEAD_FIRST_LOGIT",
        "draft_rule.SHARED_FIRST_LOGIT",
        "cost_profile.FALLBACK",
    } <= set(ENTRIES)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_each_entry_names_its_recording_write_up_and_refit_command(name):
    entry = ENTRIES[name]
    assert all(entry.get(key) for key in fitted.PROVENANCE), name
    for recording in entry["recording"]:
        assert (ROOT / recording).is_dir(), f"{name}: no recording {recording}"
    page, _, anchor = entry["results"].split()[0].partition("#")
    assert (ROOT / page).is_file(), f"{name}: no {page}"
    if anchor:
        assert f'<a id="{anchor}"></a>' in (ROOT / page).read_text(), f"{name}: {page} has no #{anchor}"
    for path in re.findall(r"docs/\S+\.(?:py|json)", entry["refit"]):  # scripts and recordings it runs on
        assert (ROOT / path).is_file(), f"{name}: no {path}"


def test_the_modules_read_the_file():
    from vllm_lookahead.core import draft_rule
    from vllm_lookahead.engine.propose import cost_profile

    assert draft_rule.PRIORS == fitted.FITTED["draft_rule.PRIORS"]
    assert list(draft_rule.SHARED_NEXT_LOGIT) == fitted.FITTED["draft_rule.SHARED_NEXT_LOGIT"]
    profile = fitted.FITTED["cost_profile.FALLBACK"]
    assert list(cost_profile.FALLBACK.tokens) == profile["tokens"]


def test_an_entry_without_its_provenance_is_refused():
    entry = {"value": 0.0, "what": "w", "recording": ["r"], "results": "p", "fit": "f", "refit": "c"}
    assert fitted.load(json.dumps({"entries": {"x": entry}})) == {"x": 0.0}  # a value of 0 is a value
    for key in ("value", *fitted.PROVENANCE):
        broken = {k: v for k, v in entry.items() if k != key}
        with pytest.raises(fitted.FittedFileError, match=f"'x' lacks {key}"):
            fitted.load(json.dumps({"entries": {"x": broken}}))
