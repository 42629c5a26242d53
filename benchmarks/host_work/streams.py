"""The token streams the host-work replay serves: recorded greedy completions of the bundled model.

A stream is one request as the engine saw it: its prompt and the tokens no speculation generated
for it (greedy output does not depend on the drafts, so the replay knows what the target model
says at every node of every tree).  Long contexts put a history of ``context_tokens`` (other
streams' prompts and outputs, back to back) in front of each prompt: the per-request state is then
built over an 8k-token history, as for a long chat or a retrieval prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

RECORDING = Path(__file__).resolve().parents[2] / "docs" / "bench" / "2026-11-22-512" / "results.json"


@dataclass(frozen=True)
class Stream:
    prompt: tuple[int, ...]
    output: tuple[int, ...]


def recorded_streams(results_json: Path = RECORDING) -> list[Stream]:
    """Every greedy completion of a bench recording's no-speculation method (all repeats and
    workloads), with its prompt rebuilt from the recording's plan and the bundled tokenizer."""
    from transformers import AutoTokenizer

    from benchmarks.replay import recorded_rounds
    from vllm_lookahead.models import prepare_default_model

    tokenizer = AutoTokenizer.from_pretrained(str(prepare_default_model()))
    raw = json.loads(Path(results_json).read_text())
    streams = [
        Stream(tuple(prompt), tuple(output))
        for round_ in recorded_rounds(raw, tokenizer)
        for pairs in round_.values()
        for prompt, output in pairs
        if len(output) >= 2
    ]
    if not streams:
        raise ValueError(f"{results_json}: no greedy completions recorded")
    return streams


def with_context(streams: list[Stream], context_tokens: int) -> list[Stream]:
    """Each stream behind a history of ``context_tokens`` tokens: the streams after it, prompts
    and outputs, back to back (cycled), so every request's history differs."""
    if context_tokens <= 0:
        return streams
    text = [t for s in streams for t in (*s.prompt, *s.output)]
    out = []
    for k, s in enumerate(streams):
        start = (k * 997) % len(text)
        history = (text[start:] + text[:start]) * (1 + context_tokens // len(text))
        out.append(Stream(tuple(history[:context_tokens]) + s.prompt, s.output))
    return out
