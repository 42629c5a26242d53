"""tests/kernels runs in a process of its own under Triton's interpreter (see its conftest);
the main suite starts it from tests/test_kernels_interpreted.py."""

import os

collect_ignore = [] if os.environ.get("TRITON_INTERPRET") == "1" else ["kernels"]
