"""Engine-free core of Lookahead Decoding (Fu et al., 2024, arXiv:2402.02057).

numpy + stdlib only: the token tree, the 2D Jacobi window, the n-gram pool,
greedy verification, exact speculative sampling over a tree, the lead candidate's
adaptive length and the per-request orchestration.  Parameters come from :class:`vllm_lookahead.config.LookaheadConfig`
(validated there, once).  The vLLM glue in ``vllm_lookahead.engine`` is written
against these names.
"""

from .draft_length import DraftLength
from .pool import NgramPool
from .request import RequestLookahead, StepDraft
from .sampling import tree_speculative_sample
from .source import SOURCE_NAMES, Source, count_by_source
from .tree import DraftTree, TreeBuilder
from .verify import greedy_verify
from .window import JacobiWindow

__all__ = [
    "DraftLength",
    "DraftTree",
    "JacobiWindow",
    "NgramPool",
    "RequestLookahead",
    "SOURCE_NAMES",
    "Source",
    "StepDraft",
    "TreeBuilder",
    "count_by_source",
    "greedy_verify",
    "tree_speculative_sample",
]
