"""``python -m benchmarks [ARGS]``: see :mod:`benchmarks.cli`."""

import sys

from benchmarks.cli import main

sys.exit(main())
