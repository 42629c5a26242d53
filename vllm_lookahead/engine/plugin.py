"""Entry point ``vllm.general_plugins: lookahead = vllm_lookahead.engine.plugin:register``.

vLLM calls :func:`register` in every process it starts (front end, engine core,
workers), possibly several times; it applies the patch table
(:mod:`vllm_lookahead.engine.patches`) once per process.  Outside the supported
vLLM range, or when a patch cannot be applied safely (a changed signature,
another plugin already replacing the same method), it applies nothing, says why
in one line, and vLLM then rejects ``method: lookahead`` itself; engines without
lookahead are unaffected either way.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from vllm_lookahead.engine.patching import PatchError
    from vllm_lookahead.engine.version import UnsupportedVLLMVersion, check_vllm_version

    try:
        check_vllm_version()
        from vllm_lookahead.engine import patches

        try:
            patches.install()
        except PatchError:
            patches.INSTALLED.undo()  # all or nothing
            raise
    except (UnsupportedVLLMVersion, PatchError) as exc:
        message = str(exc) if str(exc).startswith("vllm-lookahead") else f"vllm-lookahead: {exc}"
        logger.error("%s", message)
        print(message, file=sys.stderr)
        return
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
