"""The worker thread's share of request turnover: new requests' states built, finished ones released.

A request's :class:`~vllm_lookahead.core.RequestLookahead` -- its pools, which learn the whole
prompt, and its window -- is first needed at its first proposal, after the forward that computes
the prompt's last chunk.  Built there, on the engine thread, it is on that step's critical path:
an 8k-token prompt's pools are ~25,000 n-gram insertions (~3 ms on the 2-core CPU), and with
vLLM's GPU defaults a busy server admits about one new prompt a step.  vLLM names every request
the step it is first scheduled (``SchedulerOutput.scheduled_new_reqs``); :class:`StateBuilds`
builds its state on one worker thread, and the first proposal takes it (waiting if the worker is
at it; building it on the spot if the build is still queued).  A finished request's state goes
the same way: its arrays (a few dozen, ~0.1 ms to free) are released on the worker, not on the
engine thread that forgets the request.

What is queued (:meth:`StateBuilds.start`, :meth:`StateBuilds.release`) goes to the worker at
:meth:`StateBuilds.hand_over`, which the runner calls where the engine thread is about to wait:
on an accelerator once the step's forward is launched (the engine thread then waits for the
device with the GIL released), on a CPU at the step's start (the forward's kernels release it).
Handed over any earlier, the worker's Python work (the pools' and window's objects, ~100 us a
state) would take the GIL from the engine thread while it lays out the step.  The worker's long
loop -- learning the prompt, :func:`~vllm_lookahead.core.ngram_table.add_to_pools` over more than
:data:`~vllm_lookahead.core.pool.LONG_TEXT` tokens -- runs without the GIL.  A state is built
from the request's prompt and settings only, so one built early equals one built at its first
proposal (``tests/unit/test_state_builds.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_lookahead.core import RequestLookahead


class StateBuilds:
    """States to build and to release on one worker thread (see the module docstring)."""

    def __init__(self) -> None:
        self._queued: dict[str, Callable[[], RequestLookahead]] = {}  # builds not yet handed over
        self._pending: dict[str, Future] = {}  # builds handed over, by request id
        self._released: list[RequestLookahead] = []  # finished requests' states, not yet handed over
        self._last: Future | None = None  # the last task handed over
        self._worker: ThreadPoolExecutor | None = None  # started with the first hand-over

    def __len__(self) -> int:
        """States being built (queued or handed over, not yet taken)."""
        return len(self._queued) + len(self._pending)

    def start(self, req_id: str, build: Callable[[], RequestLookahead]) -> None:
        """Queue ``build`` for the worker (from the next :meth:`hand_over`); :meth:`take` hands its
        state to ``req_id``'s first proposal."""
        if req_id not in self._pending:
            self._queued.setdefault(req_id, build)

    def release(self, state: RequestLookahead) -> None:
        """A finished request's state, released on the worker at the next :meth:`hand_over`."""
        self._released.append(state)

    def hand_over(self) -> None:
        """Give the worker what was queued, as one task (:func:`_work`): the builds, in order, each
        with a future of its own, then the releases."""
        if not self._queued and not self._released:
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lookahead-states")
        builds = []
        for req_id, build in self._queued.items():
            future = self._pending[req_id] = Future()
            builds.append((future, build))
        self._queued.clear()
        released, self._released = self._released, []
        self._last = self._worker.submit(_work, builds, released)

    def take(self, req_id: str) -> RequestLookahead | None:
        """The state built for ``req_id`` (waiting for it if the worker is at it), once; None if
        no build was started or it is still queued, here or behind others' on the worker
        (cancelled: the caller builds it, rather than wait for the queue).  An exception the
        build raised is raised here."""
        if self._queued.pop(req_id, None) is not None:
            return None
        future = self._pending.pop(req_id, None)
        if future is None or future.cancel():
            return None
        return future.result()

    def forget(self, req_ids: Iterable[str]) -> None:
        """Requests gone before their first proposal: their builds are dropped (cancelled if not
        started)."""
        if self._pending or self._queued:
            for req_id in req_ids:
                self._queued.pop(req_id, None)
                future = self._pending.pop(req_id, None)
                if future is not None:
                    future.cancel()

    def settle(self, timeout: float | None = None) -> None:
        """Wait until the worker has done what was handed over (builds, releases)."""
        if self._last is not None:
            wait([self._last], timeout)


def _work(builds: list[tuple[Future, Callable[[], RequestLookahead]]], released: list[RequestLookahead]) -> None:
    """One hand-over on the worker: each build not cancelled meanwhile, its state (or what it
    raised) set on its future; then the released states' last reference dropped here."""
    for future, build in builds:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(build())
            except BaseException as error:  # noqa: BLE001 -- raised where the state is taken
                future.set_exception(error)
    builds.clear()
    released.clear()
