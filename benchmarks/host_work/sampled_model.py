"""The model a sampled host-work replay verifies against: logit rows peaked at the recorded token.

A sampled request's verification reads vocabulary-sized rows (its target distribution at every
tree node), so a replay of it needs rows, not only argmaxes.  :class:`PeakedModel` makes them:
at a request's ``t``-th output token the row is Gaussian noise over the vocabulary with the
recording's ``t``-th token raised so that, at the request's temperature, it is drawn with
probability ``first_choice`` (0.75: about how often a sampled request's next token is its
model's first choice).  The distribution depends on the position only: a request whose samples
leave the recording keeps being served (its text is what it emitted), and drafts are accepted
at the rate their tokens' probabilities say.

The rows span the streams' own tokens, renumbered (:func:`compact`: 7,854 distinct tokens in the
default recording), not the tokenizer's 49,152: the vocabulary-sized arithmetic is the device's
on a GPU, and on this CPU at full width it would take milliseconds per tree, which the draft
rule's verification price would then charge every sampled draft.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from benchmarks.host_work.streams import Stream

FIRST_CHOICE = 0.75


def compact(streams: list[Stream]) -> tuple[list[Stream], int]:
    """``streams`` with their tokens renumbered 0.. in order of first appearance, and how many."""
    ids: dict[int, int] = {}
    for stream in streams:
        for t in (*stream.prompt, *stream.output):
            ids.setdefault(t, len(ids))
    renumbered = [Stream(tuple(ids[t] for t in s.prompt), tuple(ids[t] for t in s.output)) for s in streams]
    return renumbered, len(ids)


class PeakedModel:
    """Logit rows over ``vocab`` tokens peaked at the recorded token of each output position."""

    def __init__(
        self, vocab: int, temperature: float, first_choice: float = FIRST_CHOICE, seed: int = 0, distinct_rows: int = 64
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self._noise = torch.randn((distinct_rows, vocab), generator=generator)  # reused rows of noise
        # exp(peak / T) against the noise's sum of exp(z / T) over the vocabulary, ~ vocab * e^(1 / 2T^2)
        self.peak = temperature * (
            math.log(first_choice / (1 - first_choice)) + math.log(vocab) + 1 / (2 * temperature**2)
        )
        self._next = 0

    def said(self, text: tuple[int, ...], position: int) -> int:
        """The token the model favours at output ``position`` of a request recorded as ``text``."""
        return int(text[min(position, len(text) - 1)])

    def rows(self, text: tuple[int, ...], positions: np.ndarray) -> torch.Tensor:
        """``[len(positions), vocab]`` logit rows, each peaked at :meth:`said` of its position."""
        index = (self._next + np.arange(len(positions))) % len(self._noise)
        self._next = int(index[-1] + 1) if len(positions) else self._next
        rows = self._noise[torch.from_numpy(index)]
        peaks = torch.tensor([self.said(text, int(p)) for p in positions], dtype=torch.long)
        rows[torch.arange(len(positions)), peaks] += self.peak
        return rows
