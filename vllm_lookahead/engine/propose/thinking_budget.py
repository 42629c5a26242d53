"""How deep a request with a thinking-token budget may be drafted.

A reasoning model thinks between a start and an end marker (token sequences such
as ``<think>`` / ``</think>``).  With ``SamplingParams.thinking_token_budget``
vLLM's ``ThinkingBudgetStateHolder`` (``vllm/v1/sample/thinking_budget_state.py``)
counts the tokens of the open section and, once the budget is spent, forces the
end marker token by token.  Lookahead verifies draft rows with the distribution
vLLM would sample from *without* that forcing and samples the root row with the
holder itself (:func:`~vllm_lookahead.engine.step.verification.sample_one_row_per_request`),
so a budgeted request is drafted only where the holder cannot force any draft row:

* no draft token is a marker token (:meth:`ThinkingLimit.cut`): sections open and
  close only at the last token of a step's output, which the holder reads exactly
  as it does without speculation;
* when the holder's state says a section is open, a draft is at most
  ``budget - count - 2`` deep, ``count`` being the holder's own count of that
  section's tokens (one token of margin);
* no draft while the holder is forcing the end marker, nor in a step whose new
  tokens contain a marker token (the holder has not read them yet).

The holder's state, not our own reading of the text, decides: vLLM's state machine
has quirks (e.g. an end marker seen before a section opens hides the section's real
end, so vLLM goes on counting), and what must be reproduced is what vLLM does.  It
is read from the holder's per-request dict (``_state``, vLLM 0.32's fields);
``tests/unit/test_thinking_budget.py`` replays decodes through vLLM's own holder and
checks that no row this module allows is one the holder forces, so a vLLM that
changes the state machine fails that test.  Work per request and step: the step's
new tokens and the draft, nothing proportional to the sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MARGIN = 1  # tokens kept between the deepest draft row and the first row the holder could force


class ThinkingLimit:
    """The draft limit of the budgeted requests of one holder (one per engine)."""

    def __init__(self, holder: Any) -> None:
        self.holder = holder
        self.start = tuple(int(t) for t in holder.think_start_token_ids)
        self.markers = frozenset(self.start) | frozenset(int(t) for t in holder.think_end_token_ids)

    @staticmethod
    def of(runner: Any) -> ThinkingLimit | None:
        holder = getattr(runner.input_batch, "thinking_budget_state_holder", None)
        if holder is None or not holder.is_enabled or not holder.think_end_token_ids:
            return None  # no reasoning config (vLLM ignores the budget) or nothing to force
        return ThinkingLimit(holder)

    def room(self, batch_index: int, num_output: int, num_prompt: int, new_tokens: Sequence[int]) -> int | None:
        """Deepest draft for the request at ``batch_index``; None = no limit from the budget.

        ``num_output``: its output length including ``new_tokens``, the tokens this step
        produced (the holder last read the output without them).
        """
        state = self.holder._state.get(batch_index)
        if state is None or state.get("thinking_token_budget", -1) == -1:
            return None  # not budgeted, or the holder gave up on it
        if any(int(t) in self.markers for t in new_tokens) or state["in_end"]:
            return 0
        start = state["start_thinking"]
        if start < 0:
            return None  # no open section: drafts only stop before marker tokens
        # The holder's count at output length m is m - base (thinking_budget_state.py,
        # _update_think_state: new_think_count / think_tokens_in_prompt).
        base = start + len(self.start) - (num_prompt if state["continue_thinking"] else 0)
        count = num_output - base
        return max(state["thinking_token_budget"] - count - 1 - MARGIN, 0)

    def cut(self, draft_tokens: Sequence[int]) -> int:
        """Number of leading draft tokens before the first marker token."""
        for i, token in enumerate(draft_tokens):
            if int(token) in self.markers:
                return i
        return len(draft_tokens)
