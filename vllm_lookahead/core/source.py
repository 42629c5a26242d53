"""Where a draft token came from: the attribution of accepted tokens.

Lookahead Decoding's claim (Fu et al., 2024, arXiv:2402.02057, Sec. 3) is that
the Jacobi window finds n-grams that appear nowhere in the text so far; prompt
lookup (and vLLM's ``ngram``/``suffix`` methods) can only copy the prompt and the
output.  Every draft node carries the source of the n-gram it was drafted from,
so each accepted token can be credited to one of:

``PROMPT``  an n-gram of the prompt;
``OUTPUT``  an n-gram of the output accepted so far (and not of the prompt);
``SHARED``  an n-gram of another request's output (``shared_pool``; not of this
            request's own text);
``WINDOW``  an n-gram only the window produced -- not (yet) in the prompt or the
            output -- or a node of the lookahead branch itself (its level-0 chain
            carries logits while the window has one level, as in Jacobi decoding).

An n-gram several sources produced is credited to the one text lookup would also
have found: ``PROMPT`` before ``OUTPUT`` before ``SHARED`` before ``WINDOW`` (so a
window n-gram that later appears in the output counts as output from then on).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Source(IntEnum):
    """Origin of a draft node (lower = weaker claim for the window: text lookup finds it too)."""

    ROOT = 0  # the tree's root: the last accepted token, not a draft
    PROMPT = 1
    OUTPUT = 2
    SHARED = 3
    WINDOW = 4


SOURCE_NAMES = tuple(s.name.lower() for s in Source if s is not Source.ROOT)  # ("prompt", "output", "shared", "window")


def count_by_source(sources: np.ndarray, nodes: np.ndarray) -> dict[str, int]:
    """How many of ``nodes`` (draft node ids) came from each source, by name."""
    counts = np.bincount(np.asarray(sources)[np.asarray(nodes, dtype=np.int64)], minlength=len(Source))
    return {name: int(counts[Source[name.upper()]]) for name in SOURCE_NAMES}
