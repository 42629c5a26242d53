"""What every part of the GPU check shares: its settings, its log and its records of cases
(:class:`Part`, saved into :class:`Results` after every case)."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

START = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - START:7.1f} s] {message}", flush=True)


@dataclass
class Settings:
    """What every part reads: where it runs and how big its sweeps are."""

    device: torch.device
    smoke: bool  # tiny shapes on the CPU under Triton's interpreter
    quick: bool  # smaller sweeps on a GPU
    out_dir: Path
    device_name: str
    date_utc: str

    @property
    def exactness_dtypes(self) -> tuple[torch.dtype, ...]:
        """bf16 first (under the interpreter its products are taken in float32 after rounding the
        operands to bf16: kernels/tree_attention.py ``_float32_dots``)."""
        return (torch.bfloat16, torch.float16, torch.float32)

    @property
    def timing(self) -> dict[str, int]:
        """Keyword arguments of :func:`~benchmarks.gpu.fixtures.time_per_call`: one call
        per sample under the interpreter (its times mean nothing), the defaults on a GPU."""
        return {"calls": 1, "samples": 2, "warmup": 1} if self.smoke else {}

    @property
    def model_dtype(self) -> torch.dtype:
        """The dtype of the timed caches and of the decoder: bf16, float32 under the interpreter."""
        return torch.float32 if self.smoke else torch.bfloat16


class Results:
    """``gpu_check.json`` and ``gpu_check.md``, rewritten after every case; ``failures`` (None
    until the exactness part runs) lists what failed in it, as ``judge`` reads its record."""

    def __init__(
        self,
        out_dir: Path,
        environment: dict[str, Any],
        renderers: dict[str, Callable[[dict], list[str]]],
        judge: Callable[[dict], list[str]],
    ) -> None:
        self.out_dir = out_dir
        self.renderers, self.judge = renderers, judge
        self.data: dict[str, Any] = {"environment": environment, "parts": {}, "failures": None}
        out_dir.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        if "exactness" in self.data["parts"]:
            self.data["failures"] = self.judge(self.data["parts"]["exactness"])
        (self.out_dir / "gpu_check.json").write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        (self.out_dir / "gpu_check.md").write_text(self.markdown())

    def markdown(self) -> str:
        env = self.data["environment"]
        lines = ["# GPU check", ""] + [f"- {key}: {value}" for key, value in env.items()] + [""]
        failures = self.data["failures"]
        verdict = (
            "not run"
            if failures is None
            else f"{len(failures)} FAILED ({'; '.join(failures)})"
            if failures
            else "every case run passed"
        )
        skipped = len(self.data["parts"].get("exactness", {}).get("skipped", []))
        verdict += f", {skipped} case(s) skipped" if skipped else ""
        lines += [f"**Exactness: {verdict}**", ""]
        for name, part in self.data["parts"].items():
            lines += [f"## {name} ({part['status']}, {part.get('seconds', 0):.0f} s of {part['budget_s']:.0f} s)", ""]
            listed = [f"- note: {note}" for note in part["notes"]]
            listed += [f"- skipped: {_describe(s)}" for s in part["skipped"]]
            listed += [f"- error: {_describe(e)}" for e in part["errors"]]
            lines += (listed + [""] if listed else []) + self.renderers[name](part) + [""]
        return "\n".join(lines) + "\n"


def _describe(entry: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in entry.items())


class Part:
    """One part's record: tables of measured rows, skipped cases, errors and notes, and its deadline."""

    def __init__(self, results: Results, name: str, budget_s: float) -> None:
        self.results, self.name = results, name
        self.start = time.monotonic()
        self.deadline = self.start + budget_s
        self.data = results.data["parts"][name] = {
            "status": "running",
            "budget_s": budget_s,
            "tables": {},
            "skipped": [],
            "errors": [],
            "notes": [],
        }

    def table(self, name: str) -> list[dict[str, Any]]:
        return self.data["tables"].setdefault(name, [])

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        log(f"{self.name}: {text}")

    def record(
        self,
        table: str,
        describe: dict[str, Any],
        measure: Callable[[], dict[str, Any]],
        brief: Callable[[dict[str, Any]], str],
    ) -> dict[str, Any] | None:
        """``measure()``'s row into ``table`` -- or the case skipped (past the deadline, out of
        memory) or its error recorded; the results are saved either way."""
        row = None
        if time.monotonic() > self.deadline:
            self.data["skipped"].append({**describe, "reason": "time budget"})
            log(f"{self.name}: skipped (time budget): {_describe(describe)}")
        else:
            try:
                row = measure()
            except torch.OutOfMemoryError:
                self.data["skipped"].append({**describe, "reason": "out of memory"})
                log(f"{self.name}: skipped (out of memory): {_describe(describe)}")
            except Exception as exc:  # noqa: BLE001 -- a failing case is recorded, the run goes on
                self.data["errors"].append({**describe, "error": f"{type(exc).__name__}: {exc}"})
                log(f"{self.name}: {_describe(describe)} raised\n{traceback.format_exc()}")
            else:
                self.table(table).append(row)
                log(f"{self.name}: {brief(row)}")
        if row is None and torch.cuda.is_available():
            torch.cuda.empty_cache()  # what the failed case held (its frames are gone by now)
        self.results.save()
        return row

    def finish(self) -> None:
        seconds = time.monotonic() - self.start
        skipped = len(self.data["skipped"])
        self.data.update(seconds=seconds, status=f"{skipped} case(s) skipped" if skipped else "complete")
        log(f"{self.name}: done in {seconds:.1f} s" + (f", {skipped} case(s) skipped" if skipped else ""))
        self.results.save()
