"""Entry point ``vllm.general_plugins: lookahead = vllm_lookahead.engine.plugin:register``.

vLLM calls :func:`register` in every process it starts (front end, engine core,
workers), possibly several times; it installs the config hook and the runner
patches once per process.  Outside the supported vLLM range it installs nothing
and says why (vLLM then rejects ``method: lookahead`` itself).
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format

_installed = False


def register() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from vllm_lookahead.engine.version import UnsupportedVLLMVersion, check_vllm_version

    try:
        check_vllm_version()
    except UnsupportedVLLMVersion as exc:
        logger.error("%s", exc)
        print(f"vllm-lookahead: {exc}", file=sys.stderr)
        return
    from vllm_lookahead.engine import config_hook, patches

    config_hook.install()
    patches.install()
    _install_excepthook()


def _install_excepthook() -> None:
    """An uncaught config error prints one line, not a traceback through vLLM."""
    from vllm_lookahead.config import LookaheadConfigError

    previous = sys.excepthook
    if getattr(previous, "__lookahead__", False):
        return

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, LookaheadConfigError):
            print(f"error: {exc}", file=sys.stderr)
            return
        previous(exc_type, exc, tb)

    hook.__lookahead__ = True  # type: ignore[attr-defined]
    sys.excepthook = hook
