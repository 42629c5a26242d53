"""The Triton kernels run here under Triton's interpreter (numpy on the CPU).

Triton fixes at import whether ``@triton.jit`` functions -- its own library's too -- are
interpreted, so this folder runs in a process of its own that has ``TRITON_INTERPRET=1`` from
the start: ``TRITON_INTERPRET=1 python -m pytest tests/kernels`` (the main suite does exactly
that, tests/test_kernels_interpreted.py, and leaves this folder out of its own collection)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    raise pytest.UsageError(
        "tests/kernels runs under Triton's interpreter: TRITON_INTERPRET=1 python -m pytest tests/kernels"
    )


def pytest_collection_modifyitems(items):
    # The interpreter converts 0-d arrays to Python scalars (its own deprecation warning, not ours).
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"))
