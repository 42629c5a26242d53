from hypothesis import given
from hypothesis import strategies as st

from vllm_lookahead.core.draft_length import DraftLength


def test_doubles_while_accepted_in_full_and_falls_back_at_a_miss():
    length = DraftLength(floor=4, maximum=32)
    seen = []
    for _ in range(5):
        seen.append(length.current)
        length.update(length.current, length.current)
    assert seen == [4, 8, 16, 32, 32]
    length.update(32, 31)
    assert length.current == 4


def test_steps_that_prove_nothing_change_nothing():
    length = DraftLength(floor=4, maximum=32)
    length.update(4, 4)
    assert length.current == 8
    length.update(0, 0)  # no lead candidate
    length.update(3, 3)  # cut short and accepted: no evidence for 16
    assert length.current == 8
    length.update(3, 5)  # another, longer branch accepted more: the lead was accepted in full
    assert length.current == 8


def test_maximum_below_floor_is_the_paper():
    length = DraftLength(floor=4, maximum=0)
    length.update(4, 4)
    assert length.current == 4


@given(
    floor=st.integers(1, 8),
    maximum=st.integers(0, 64),
    steps=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 70)), max_size=40),
)
def test_always_within_floor_and_maximum(floor, maximum, steps):
    length = DraftLength(floor=floor, maximum=maximum)
    for drafted, accepted in steps:
        length.update(drafted, accepted)
        assert floor <= length.current <= max(floor, maximum)
