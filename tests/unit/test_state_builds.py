"""New requests' states built on the worker thread (:mod:`vllm_lookahead.engine.propose.state_builds`)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import RequestLookahead
from vllm_lookahead.core.pool import LONG_TEXT
from vllm_lookahead.engine.propose.state_builds import StateBuilds


def _state(prompt: np.ndarray) -> RequestLookahead:
    return RequestLookahead(LookaheadConfig(), prompt, seed=7)


def _contents(state: RequestLookahead) -> tuple:
    return [pool.items() for pool in state.text.pools()], [level.tolist() for level in state.window.levels]


def test_a_state_built_on_the_worker_equals_one_built_on_the_spot():
    """Long prompts (learnt without the GIL) built on the worker while this thread keeps looking
    up and learning in another request's pools: each taken state holds what one built here holds."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 50, size=n).astype(np.int64) for n in (LONG_TEXT * 4, 40, LONG_TEXT * 9)]
    builds = StateBuilds()
    for i, prompt in enumerate(prompts):
        builds.start(f"r{i}", lambda p=prompt: _state(p))
    builds.hand_over()
    busy, history = _state(prompts[1]), prompts[1]
    for _ in range(200):  # the engine thread's own work meanwhile
        history = np.concatenate([history, rng.integers(0, 50, size=3)])
        busy.text.catch_up(history)
        busy.text.lookup(history[-3:])
    _drained(builds)
    for i, prompt in enumerate(prompts):
        taken = builds.take(f"r{i}")
        assert taken is not None and _contents(taken) == _contents(_state(prompt))
        assert builds.take(f"r{i}") is None  # taken once
    assert builds.take("never-started") is None and len(builds) == 0


def test_a_build_that_failed_raises_where_its_state_is_taken():
    builds = StateBuilds()

    def broken() -> RequestLookahead:
        raise ValueError("no state")

    builds.start("r", broken)
    builds.hand_over()
    with pytest.raises(ValueError, match="no state"):
        builds.take("r")


def _drained(builds: StateBuilds) -> None:
    """Wait until the worker has run everything queued before now (one worker, in order)."""
    done = threading.Event()
    builds.start("drained", done.set)
    builds.hand_over()
    assert done.wait(30)
    builds.forget(["drained"])


def test_a_request_gone_before_its_first_proposal_drops_its_build():
    """Forgotten builds are dropped: one waiting behind a running build is cancelled, none is kept."""
    started, release, ran = threading.Event(), threading.Event(), []
    builds = StateBuilds()
    builds.start("running", lambda: started.set() or release.wait(5))
    builds.start("waiting", lambda: ran.append("waiting"))
    builds.start("waiting", lambda: ran.append("twice"))  # a request starts one build
    builds.start("queued", lambda: ran.append("queued"))
    builds.hand_over()
    builds.start("not handed over", lambda: ran.append("not handed over"))
    assert started.wait(5)
    builds.forget(["waiting", "running", "unknown", "not handed over", "queued"])
    builds.hand_over()
    release.set()
    _drained(builds)
    assert ran == [] and len(builds) == 0 and builds.take("waiting") is None and builds.take("running") is None


def test_a_build_still_queued_is_left_to_the_caller_and_a_running_one_waited_for():
    """A first proposal does not wait behind other requests' builds: a build still queued is
    cancelled (None: the caller builds the state itself); one the worker is at is waited for."""
    started, release, ran = threading.Event(), threading.Event(), []
    builds = StateBuilds()
    builds.start("running", lambda: started.set() or (release.wait(5) and "built"))
    builds.start("queued", lambda: ran.append("queued"))
    builds.hand_over()
    builds.start("not handed over", lambda: ran.append("not handed over"))
    assert started.wait(5) and builds.take("queued") is None and builds.take("not handed over") is None
    threading.Timer(0.05, release.set).start()
    assert builds.take("running") == "built" and len(builds) == 0
    _drained(builds)
    assert ran == []


def test_queued_work_waits_for_the_hand_over_and_finished_states_are_freed_on_the_worker():
    """Nothing runs before :meth:`StateBuilds.hand_over` (the runner hands over where the engine
    thread waits); a released state's last reference goes on the worker thread, which frees it."""
    builds, ran, freed_on = StateBuilds(), [], []
    builds.start("r", lambda: ran.append(threading.current_thread().name) or "built")

    class Finished:  # stands for a finished request's state: noted where it is freed
        def __del__(self) -> None:
            freed_on.append(threading.current_thread().name)

    builds.release(Finished())  # type: ignore[arg-type]
    assert ran == [] and freed_on == [] and len(builds) == 1
    builds.hand_over()
    builds.settle(30)
    assert builds.take("r") == "built" and len(builds) == 0
    main = threading.current_thread().name
    assert len(ran) == 1 and ran[0] != main and freed_on == [ran[0]]
    builds.hand_over()  # nothing queued: nothing to do
    builds.settle(30)
