"""New requests' states built beside the engine thread, while their prompts' forward runs.

A request's :class:`~vllm_lookahead.core.RequestLookahead` -- its pools, which learn the whole
prompt, and its window -- is first needed at its first proposal, after the forward that computes
the prompt's last chunk.  Built there, on the engine thread, it is on that step's critical path:
an 8k-token prompt's pools are ~25,000 n-gram insertions (~3 ms on the 2-core CPU), and with
vLLM's GPU defaults a busy server admits about one new prompt a step.  vLLM names every request
the step it is first scheduled (``SchedulerOutput.scheduled_new_reqs``); :class:`StateBuilds`
starts its state there on one worker thread, and the first proposal takes it (waiting if the
worker is at it; building it on the spot if no build was started or it is still queued).

The worker's long loop -- learning the prompt, :func:`~vllm_lookahead.core.ngram_table.add_to_pools`
over more than :data:`~vllm_lookahead.core.pool.LONG_TEXT` tokens -- runs without the GIL, so
the engine thread, which waits for the device with the GIL released, gets it back at once; what
the worker does with the GIL (the pools' and window's Python objects, ~100 us) is short.  A state
is built from the request's prompt and settings only, so one built early equals one built at its
first proposal (``tests/unit/test_state_builds.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_lookahead.core import RequestLookahead


class StateBuilds:
    """States being built on one worker thread, by request id."""

    def __init__(self) -> None:
        self._pending: dict[str, Future] = {}
        self._worker: ThreadPoolExecutor | None = None  # started with the first build

    def __len__(self) -> int:
        return len(self._pending)

    def start(self, req_id: str, build: Callable[[], RequestLookahead]) -> None:
        """Run ``build`` on the worker thread; :meth:`take` hands its state to ``req_id``'s
        first proposal."""
        if req_id in self._pending:
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lookahead-states")
        self._pending[req_id] = self._worker.submit(build)

    def take(self, req_id: str) -> RequestLookahead | None:
        """The state built for ``req_id`` (waiting for it if the worker is at it), once; None if
        no build was started or it is still queued behind others' (cancelled: the caller builds
        it, rather than wait for the queue).  An exception the build raised is raised here."""
        future = self._pending.pop(req_id, None)
        if future is None or future.cancel():
            return None
        return future.result()

    def forget(self, req_ids: Iterable[str]) -> None:
        """Requests gone before their first proposal: their builds are dropped (cancelled if not
        started)."""
        if self._pending:
            for req_id in req_ids:
                future = self._pending.pop(req_id, None)
                if future is not None:
                    future.cancel()
